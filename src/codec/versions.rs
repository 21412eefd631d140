//! Schema changes aligned at a barrier (docs/WIRE.md "Schema changes"): the versions of each table's
//! row schema, the epoch each is in force from, which changes are compatible, and Avro schema
//! resolution of a row datum from an older version to a newer one.
//!
//! This module decides; it reads no files. Where the versions come from is the caller's loader
//! (`snapshot::versions` reads `<snapshot dir>/schema_versions/`); [`Evolution`] is the shared,
//! refreshable handle the codec and the stores hold.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use apache_avro::Schema;

use super::table::TableSchema;
pub use super::wire::hex;
use super::wire::{CodecError, LogCodec};
use crate::core::Epoch;

/// One version of a table's row schema.
#[derive(Clone, Debug)]
pub struct RowVersion {
    /// The first epoch whose changes are written with this version (`Epoch(0)` for the manifest's).
    pub from_epoch: Epoch,
    pub table: TableSchema,
    /// The fingerprint of the log-record schema with this row record (what changes carry).
    pub fingerprint: [u8; 8],
}

/// A version announced by the writer, as the loader read it (before it is checked).
#[derive(Clone, Debug)]
pub struct AnnouncedVersion {
    /// Where it was read (a file), for errors.
    pub source: String,
    /// The table it belongs to (`None` in a one-table log).
    pub table: Option<String>,
    pub from_epoch: Epoch,
    /// The row schema's JSON text.
    pub row_schema: String,
    /// The fingerprint the source names it by (its file name), checked against the schema.
    pub named_fingerprint: Option<String>,
    /// The table's primary key, in the versions of a table added to the log after its first
    /// snapshot (docs/WIRE.md "Tables added").
    pub primary_key: Option<Vec<String>>,
}

/// Why a schema change is refused: the job stops before anything of it is applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaChangeError {
    #[error("incompatible schema change of table {table} at epoch {from_epoch} ({place}): {why}")]
    Incompatible {
        table: String,
        from_epoch: Epoch,
        place: String,
        why: String,
    },
    #[error("schema version in {place}: {why}")]
    Bad { place: String, why: String },
}

/// Every version of every table of a log, each table's sorted by `from_epoch`; index 0 is the
/// manifest's row schema, in force from the start.
#[derive(Clone, Debug)]
pub struct SchemaVersions {
    tables: Vec<Vec<RowVersion>>,
    /// Versions at or before the snapshot epoch, which the snapshot holds (counted, not kept).
    history: usize,
}

impl SchemaVersions {
    /// The versions of a log whose manifest names `base` (in manifest order, with their names
    /// `names`; a one-table log's name is `None`), announced as `announced`. Checks every rule of
    /// docs/WIRE.md "Schema changes" that needs no log.
    pub fn new(
        base: &[TableSchema],
        names: &[Option<String>],
        snapshot_epoch: Epoch,
        announced: &[AnnouncedVersion],
    ) -> Result<Self, SchemaChangeError> {
        let mut tables: Vec<Vec<RowVersion>> = Vec::with_capacity(base.len());
        for t in base {
            let fingerprint = fingerprint_of(t).map_err(|e| SchemaChangeError::Bad {
                place: "the manifest".into(),
                why: e.to_string(),
            })?;
            tables.push(vec![RowVersion {
                from_epoch: Epoch(0),
                table: t.clone(),
                fingerprint,
            }]);
        }
        let mut sorted: Vec<&AnnouncedVersion> = announced.iter().collect();
        sorted.sort_by_key(|a| a.from_epoch);
        // Per table, the last version at or before the snapshot epoch (the one in force at it).
        let mut history: Vec<Option<&AnnouncedVersion>> = vec![None; base.len()];
        let mut skipped = 0;
        // The manifest's names, then those of the tables added to the log since.
        let mut names: Vec<Option<String>> = names.to_vec();
        // A one-table manifest (named by its row record, or not at all): the log may have
        // gained tables since, and then names its first in the versions it writes.
        let began_with_one = base.len() == 1;
        for a in sorted {
            let bad = |why: String| SchemaChangeError::Bad {
                place: a.source.clone(),
                why,
            };
            let index = match &a.table {
                // A one-table log; or a log that began with one table and gained others: the
                // versions of its first table before that (history to a later snapshot).
                None if base.len() == 1 || a.from_epoch <= snapshot_epoch => 0,
                None => {
                    return Err(bad(
                        "the log has several tables: name the version's table".into()
                    ))
                }
                Some(name) => match names
                    .iter()
                    .position(|n| n.as_deref() == Some(name.as_str()))
                {
                    Some(i) => i,
                    None => match &a.primary_key {
                        // A table added to the log: passed over by a job of this snapshot.
                        Some(key) => {
                            let table = TableSchema::parse(&a.row_schema, key).map_err(|e| {
                                bad(format!(
                                    "the row schema of table {name}, added to the log: {e}"
                                ))
                            })?;
                            let fingerprint = new_fingerprint(a, &table, &tables)?;
                            names.push(Some(name.clone()));
                            history.push(None);
                            tables.push(vec![RowVersion {
                                from_epoch: a.from_epoch,
                                table,
                                fingerprint,
                            }]);
                            continue;
                        }
                        // A log that began with one table names it once it has several.
                        None if began_with_one => 0,
                        None => return Err(bad(format!("the log has no table {name}"))),
                    },
                },
            };
            let versions = &mut tables[index];
            let previous = versions.last().expect("the manifest's version");
            let table_name = names[index]
                .clone()
                .unwrap_or_else(|| previous.table.name.clone());
            if a.from_epoch <= snapshot_epoch {
                // History the snapshot already holds: a later snapshot of a capture reads the
                // versions announced before it too (they are its capture's). The last of them is
                // checked against the manifest below.
                history[index] = Some(a);
                skipped += 1;
                continue;
            }
            if previous.from_epoch == a.from_epoch {
                return Err(bad(format!(
                    "two versions of table {table_name} start at epoch {}",
                    a.from_epoch
                )));
            }
            let incompatible = |why: String| SchemaChangeError::Incompatible {
                table: table_name.clone(),
                from_epoch: a.from_epoch,
                place: a.source.clone(),
                why,
            };
            let table = TableSchema::parse(&a.row_schema, &previous.table.primary_key)
                .map_err(|e| incompatible(e.to_string()))?;
            compatible(&previous.table, &table).map_err(incompatible)?;
            let fingerprint = new_fingerprint(a, &table, &tables)?;
            tables[index].push(RowVersion {
                from_epoch: a.from_epoch,
                table,
                fingerprint,
            });
        }
        for (index, a) in history.into_iter().enumerate() {
            let Some(a) = a else { continue };
            in_force_at_snapshot(&mut tables[index][0], a, snapshot_epoch)?;
        }
        Ok(SchemaVersions {
            tables,
            history: skipped,
        })
    }

    /// The versions of table `table` (index 0: the manifest's).
    pub fn of(&self, table: usize) -> &[RowVersion] {
        &self.tables[table]
    }

    /// The table and version a fingerprint names.
    pub fn by_fingerprint(&self, fp: &[u8]) -> Option<(usize, usize)> {
        self.tables.iter().enumerate().find_map(|(t, vs)| {
            vs.iter()
                .position(|v| v.fingerprint[..] == *fp)
                .map(|k| (t, k))
        })
    }

    /// The version of table `table` in force at `epoch`.
    pub fn at(&self, table: usize, epoch: Epoch) -> usize {
        self.tables[table]
            .iter()
            .rposition(|v| v.from_epoch <= epoch)
            .unwrap_or(0)
    }

    /// How many tables the log has: the manifest's and those added since.
    pub fn table_count(&self) -> usize {
        self.tables.len()
    }

    /// The first epoch of the version after `version` of `table`, if one is announced.
    pub fn until(&self, table: usize, version: usize) -> Option<Epoch> {
        self.tables[table].get(version + 1).map(|v| v.from_epoch)
    }

    /// Whether some table's version starts at `epoch`.
    pub fn starts_at(&self, epoch: Epoch) -> bool {
        self.tables
            .iter()
            .flatten()
            .any(|v| v.from_epoch == epoch && epoch > Epoch(0))
    }

    /// Every version read, the manifest's and the history included: what the source holds.
    fn count(&self) -> usize {
        self.tables.iter().map(Vec::len).sum::<usize>() + self.history
    }
}

/// The fingerprint of `a`'s row schema `table`: the one its file is named by, and no version of
/// the log (`known`) has it already.
fn new_fingerprint(
    a: &AnnouncedVersion,
    table: &TableSchema,
    known: &[Vec<RowVersion>],
) -> Result<[u8; 8], SchemaChangeError> {
    let bad = |why: String| SchemaChangeError::Bad {
        place: a.source.clone(),
        why,
    };
    let fingerprint = fingerprint_of(table).map_err(|e| bad(e.to_string()))?;
    check_named(a, &fingerprint)?;
    if known.iter().flatten().any(|v| v.fingerprint == fingerprint) {
        return Err(bad(format!(
            "its row schema is already a version of the log (fingerprint {})",
            super::wire::hex(&fingerprint)
        )));
    }
    Ok(fingerprint)
}

/// A version file is named by its fingerprint: the name must be its schema's.
fn check_named(a: &AnnouncedVersion, fingerprint: &[u8; 8]) -> Result<(), SchemaChangeError> {
    match &a.named_fingerprint {
        Some(named) if *named != super::wire::hex(fingerprint) => Err(SchemaChangeError::Bad {
            place: a.source.clone(),
            why: format!(
                "named by fingerprint {named}, but its log-record schema's fingerprint is {}",
                super::wire::hex(fingerprint)
            ),
        }),
        _ => Ok(()),
    }
}

/// A later snapshot of a capture holds its table at the version in force at its epoch (`a`, the
/// last announced at or before it): the manifest's row schema has that version's fields, and the
/// changes after the snapshot carry that version's fingerprint, which is the manifest's version
/// from then on. Its fields in another order, or other fields, are refused: the snapshot is not of
/// this log.
fn in_force_at_snapshot(
    base: &mut RowVersion,
    a: &AnnouncedVersion,
    snapshot_epoch: Epoch,
) -> Result<(), SchemaChangeError> {
    let bad = |why: String| SchemaChangeError::Bad {
        place: a.source.clone(),
        why,
    };
    let table = TableSchema::parse(&a.row_schema, &base.table.primary_key)
        .map_err(|e| bad(e.to_string()))?;
    let fields = |t: &TableSchema| -> Vec<String> {
        t.json["fields"]
            .as_array()
            .map(|fs| {
                fs.iter()
                    .map(|f| f["name"].as_str().unwrap_or_default().to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    let (held, in_force) = (fields(&base.table), fields(&table));
    if held != in_force {
        return Err(bad(format!(
            "this version (from epoch {}) is in force at the snapshot epoch {snapshot_epoch} with fields {in_force:?}, but the snapshot holds {held:?}: the snapshot is not of this log",
            a.from_epoch
        )));
    }
    let fingerprint = fingerprint_of(&table).map_err(|e| bad(e.to_string()))?;
    check_named(a, &fingerprint)?;
    *base = RowVersion {
        from_epoch: Epoch(0),
        table,
        fingerprint,
    };
    Ok(())
}

fn fingerprint_of(table: &TableSchema) -> Result<[u8; 8], CodecError> {
    Ok(LogCodec::new(table.clone())?.fingerprint())
}

/// Whether `new` may follow `old` (docs/WIRE.md "Schema changes"): the same record name and primary
/// key (each key field unchanged), and per field: unchanged, added with a default, dropped, int
/// widened to long, float to double (also inside a nullable union), or an enum with symbols appended.
/// The error names the field and the change.
pub fn compatible(old: &TableSchema, new: &TableSchema) -> Result<(), String> {
    let (Schema::Record(o), Schema::Record(n)) = (&old.schema, &new.schema) else {
        unreachable!("row schemas are records")
    };
    if o.name != n.name {
        return Err(format!(
            "the row record is renamed from {} to {}",
            o.name.fullname(None),
            n.name.fullname(None)
        ));
    }
    if old.primary_key != new.primary_key {
        return Err("the primary key changes".into());
    }
    for f in &n.fields {
        match o.fields.iter().find(|x| x.name == f.name) {
            None => {
                if f.default.is_none() {
                    return Err(format!(
                        "field {} is added without a default (add it with a default, or as a nullable union with default null)",
                        f.name
                    ));
                }
            }
            Some(prev) => {
                let key = new.primary_key.contains(&f.name);
                if key && prev.schema.canonical_form() != f.schema.canonical_form() {
                    return Err(format!("primary-key field {} changes its type", f.name));
                }
                field_change(&prev.schema, &f.schema)
                    .map_err(|why| format!("field {}: {why}", f.name))?;
            }
        }
    }
    for f in &o.fields {
        if !n.fields.iter().any(|x| x.name == f.name) && old.primary_key.contains(&f.name) {
            return Err(format!("primary-key field {} is dropped", f.name));
        }
    }
    Ok(())
}

/// A field's type change: none, a widening, a nullable union of one, or appended enum symbols.
fn field_change(old: &Schema, new: &Schema) -> Result<(), String> {
    if old.canonical_form() == new.canonical_form() {
        return Ok(());
    }
    match (old, new) {
        (Schema::Int, Schema::Long) | (Schema::Float, Schema::Double) => Ok(()),
        (Schema::Enum(a), Schema::Enum(b))
            if a.name == b.name
                && b.symbols.len() > a.symbols.len()
                && b.symbols[..a.symbols.len()] == a.symbols[..] =>
        {
            Ok(())
        }
        (Schema::Union(a), Schema::Union(b))
            if a.variants().len() == b.variants().len()
                && a.variants()
                    .iter()
                    .zip(b.variants())
                    .all(|(x, y)| field_change(x, y).is_ok()) =>
        {
            Ok(())
        }
        _ => Err(format!(
            "{} to {} is not a compatible change (only int to long, float to double, enum symbols appended)",
            old.canonical_form(),
            new.canonical_form()
        )),
    }
}

/// A row datum written with `from`, as `to` reads it (Avro schema resolution for the changes
/// [`compatible`] allows: fields added with their default, fields dropped, int to long, float to
/// double, enum symbols appended, the same in a union's branch), re-encoded with `to`.
///
/// Resolved here field by field, not by apache-avro's reader-schema decode: that one refuses a
/// `bytes` decimal whose value takes fewer bytes than the largest value of its precision ("Precision
/// 20 too small to hold decimal values with 7 bytes"), so a table with a decimal column (a MariaDB
/// `bigint unsigned`, a PostgreSQL `numeric(p,s)`) could take no second schema version.
pub fn resolve(datum: &[u8], from: &TableSchema, to: &TableSchema) -> Result<Vec<u8>, CodecError> {
    use apache_avro::types::Value;
    let bad = |e: String| CodecError::Decode(format!("resolving the row to the new schema: {e}"));
    let mut r = datum;
    let Value::Record(fields) =
        apache_avro::from_avro_datum(&from.schema, &mut r, None).map_err(|e| bad(e.to_string()))?
    else {
        return Err(bad("not a record".into()));
    };
    let Schema::Record(record) = &to.schema else {
        unreachable!("row schemas are records")
    };
    let mut out = Vec::with_capacity(record.fields.len());
    for f in &record.fields {
        let value = match fields.iter().find(|(name, _)| *name == f.name) {
            Some((_, v)) => widen(v.clone(), &f.schema),
            None => {
                let default = f
                    .default
                    .clone()
                    .ok_or_else(|| bad(format!("field {} has no default", f.name)))?;
                Value::from(default)
                    .resolve(&f.schema)
                    .map_err(|e| bad(format!("field {}'s default: {e}", f.name)))?
            }
        };
        out.push((f.name.clone(), value));
    }
    to.encode_row(&Value::Record(out))
}

/// A value of a field as a compatible later type of it reads it ([`field_change`]).
fn widen(v: apache_avro::types::Value, to: &Schema) -> apache_avro::types::Value {
    use apache_avro::types::Value;
    match (v, to) {
        (Value::Int(i), Schema::Long) => Value::Long(i as i64),
        (Value::Float(x), Schema::Double) => Value::Double(x as f64),
        (Value::Union(i, inner), Schema::Union(u)) => match u.variants().get(i as usize) {
            Some(branch) => Value::Union(i, Box::new(widen(*inner, branch))),
            None => Value::Union(i, inner),
        },
        (v, _) => v,
    }
}

type Loader =
    Box<dyn Fn() -> Result<Vec<AnnouncedVersion>, SchemaChangeError> + Send + Sync + 'static>;

/// How many versions the source holds now, cheaply (without reading them).
type Probe = Box<dyn Fn() -> usize + Send + Sync + 'static>;

/// The log's versions as this process knows them, shared by the codec and the stores of a job, and
/// read again from the loader when a fingerprint is unknown or a commit may pass a new version's
/// epoch (versions are only ever added).
pub struct Evolution {
    base: Vec<TableSchema>,
    names: Vec<Option<String>>,
    snapshot_epoch: Epoch,
    loader: Loader,
    probe: Probe,
    current: RwLock<Arc<SchemaVersions>>,
    /// The smallest `from_epoch` of a version after the manifest's, per the current versions
    /// (`u64::MAX`: none): below it, the manifest's fingerprint needs no lookup.
    first_change: AtomicU64,
    refreshing: Mutex<()>,
}

impl std::fmt::Debug for Evolution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Evolution")
            .field("versions", &self.current())
            .finish()
    }
}

impl Evolution {
    /// Loads the versions once (an error is the job's start-up error).
    pub fn new(
        base: Vec<TableSchema>,
        names: Vec<Option<String>>,
        snapshot_epoch: Epoch,
        loader: Loader,
        probe: Probe,
    ) -> Result<Self, SchemaChangeError> {
        let versions = SchemaVersions::new(&base, &names, snapshot_epoch, &loader()?)?;
        let e = Evolution {
            base,
            names,
            snapshot_epoch,
            loader,
            probe,
            current: RwLock::new(Arc::new(SchemaVersions {
                tables: Vec::new(),
                history: 0,
            })),
            first_change: AtomicU64::new(u64::MAX),
            refreshing: Mutex::new(()),
        };
        e.install(versions);
        Ok(e)
    }

    fn install(&self, v: SchemaVersions) {
        let first = v
            .tables
            .iter()
            .flat_map(|vs| vs.iter().skip(1))
            .map(|v| v.from_epoch.0)
            .min()
            .unwrap_or(u64::MAX);
        *self.current.write().expect("not poisoned") = Arc::new(v);
        self.first_change.store(first, Ordering::Release);
    }

    /// The versions as last loaded.
    pub fn current(&self) -> Arc<SchemaVersions> {
        self.current.read().expect("not poisoned").clone()
    }

    /// Whether `epoch` is before every announced change (the manifest's schemas are in force).
    pub fn before_first_change(&self, epoch: Epoch) -> bool {
        epoch.0 < self.first_change.load(Ordering::Acquire)
    }

    /// Reads the versions again if the source holds more than are known (one directory listing
    /// when it does not): what the codec does at every checkpoint barrier, since a version starts
    /// after one and is announced before it.
    pub fn refresh_if_grown(&self) -> Result<Arc<SchemaVersions>, SchemaChangeError> {
        let known = self.current();
        if (self.probe)() + self.base.len() != known.count() {
            return self.refresh();
        }
        Ok(known)
    }

    /// Reads the versions again; returns the current ones. A version once known never changes: a
    /// source that now says otherwise is an error.
    pub fn refresh(&self) -> Result<Arc<SchemaVersions>, SchemaChangeError> {
        let _one = self.refreshing.lock().expect("not poisoned");
        let fresh = SchemaVersions::new(
            &self.base,
            &self.names,
            self.snapshot_epoch,
            &(self.loader)()?,
        )?;
        let known = self.current();
        for (t, vs) in known.tables.iter().enumerate() {
            for (k, v) in vs.iter().enumerate() {
                let same = fresh.tables[t].get(k).is_some_and(|f| {
                    f.fingerprint == v.fingerprint && f.from_epoch == v.from_epoch
                });
                if !same {
                    return Err(SchemaChangeError::Bad {
                        place: "the schema versions".into(),
                        why: format!(
                            "version {k} of table {} (from epoch {}) changed or disappeared since it was read; versions are only ever added",
                            v.table.name, v.from_epoch
                        ),
                    });
                }
            }
        }
        if fresh.count() != known.count() {
            self.install(fresh);
        }
        Ok(self.current())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row with a short `bytes` decimal (a bigint unsigned of 7 bytes, precision 20) resolves
    /// to a version adding a field: apache-avro's reader-schema decode refused it; an int widens
    /// to long, and the added field takes its default.
    #[test]
    fn a_short_decimal_resolves_and_fields_widen_and_take_their_defaults() {
        use apache_avro::types::Value;
        let key = ["id".to_string()];
        let from = TableSchema::parse(
            r#"{"type":"record","name":"T","fields":[{"name":"id","type":"int"},{"name":"tier","type":["null",{"type":"bytes","logicalType":"decimal","precision":20,"scale":0}],"default":null}]}"#,
            &key,
        )
        .unwrap();
        let to = TableSchema::parse(
            r#"{"type":"record","name":"T","fields":[{"name":"id","type":"long"},{"name":"tier","type":["null",{"type":"bytes","logicalType":"decimal","precision":20,"scale":0}],"default":null},{"name":"active","type":"boolean","default":true}]}"#,
            &key,
        )
        .unwrap();
        let tier = apache_avro::Decimal::from(vec![3, 232, 0, 0, 0, 0, 0]);
        let datum = from
            .encode_row(&Value::Record(vec![
                ("id".into(), Value::Int(5)),
                (
                    "tier".into(),
                    Value::Union(1, Box::new(Value::Decimal(tier.clone()))),
                ),
            ]))
            .unwrap();
        let resolved = resolve(&datum, &from, &to).unwrap();
        assert_eq!(
            to.decode_row(&resolved).unwrap(),
            vec![
                Value::Long(5),
                Value::Union(1, Box::new(Value::Decimal(tier))),
                Value::Boolean(true)
            ]
        );
    }

    fn schema(fields: &str) -> TableSchema {
        TableSchema::parse(
            &format!(r#"{{"type":"record","name":"T","fields":[{fields}]}}"#),
            &["id".to_string()],
        )
        .unwrap()
    }

    const BASE: &str = r#"{"name":"id","type":"long"},{"name":"n","type":"int"},{"name":"f","type":["null","float"]},{"name":"e","type":{"type":"enum","name":"E","symbols":["a","b"]}}"#;

    #[test]
    fn the_listed_changes_are_compatible() {
        let old = schema(BASE);
        for new in [
            // added with a default
            format!(r#"{BASE},{{"name":"x","type":"string","default":"eu"}}"#),
            // added nullable
            format!(r#"{BASE},{{"name":"x","type":["null","long"],"default":null}}"#),
            // int to long, float to double in a union, enum symbol appended, a column dropped
            r#"{"name":"id","type":"long"},{"name":"n","type":"long"},{"name":"f","type":["null","double"]},{"name":"e","type":{"type":"enum","name":"E","symbols":["a","b","c"]}}"#.to_string(),
            r#"{"name":"id","type":"long"},{"name":"n","type":"int"}"#.to_string(),
        ] {
            compatible(&old, &schema(&new)).unwrap_or_else(|e| panic!("{new}: {e}"));
        }
    }

    #[test]
    fn incompatible_changes_name_the_field() {
        let old = schema(BASE);
        for (new, names) in [
            (format!(r#"{BASE},{{"name":"x","type":"string"}}"#), "field x is added without a default"),
            (r#"{"name":"id","type":"long"},{"name":"n","type":"string"}"#.to_string(), "field n:"),
            (r#"{"name":"id","type":"long"},{"name":"n","type":"int"},{"name":"e","type":{"type":"enum","name":"E","symbols":["b","a"]}}"#.to_string(), "field e:"),
            (r#"{"name":"id","type":"string"},{"name":"n","type":"int"}"#.to_string(), "primary-key field id"),
            (r#"{"name":"id","type":"long"},{"name":"n","type":"long"},{"name":"f","type":["null","int"]}"#.to_string(), "field f:"),
        ] {
            let e = compatible(&old, &schema(&new)).expect_err(&new);
            assert!(e.contains(names), "{e} should name {names}");
        }
    }

    #[test]
    fn resolution_fills_defaults_widens_and_drops() {
        let v0 = schema(
            r#"{"name":"id","type":"long"},{"name":"n","type":"int"},{"name":"p","type":"string"}"#,
        );
        let v1 = schema(
            r#"{"name":"id","type":"long"},{"name":"n","type":"long"},{"name":"x","type":"string","default":"eu"}"#,
        );
        use apache_avro::types::Value;
        let d0 = v0
            .encode_row(&Value::Record(vec![
                ("id".into(), Value::Long(7)),
                ("n".into(), Value::Int(-3)),
                ("p".into(), Value::String("gone".into())),
            ]))
            .unwrap();
        let d1 = resolve(&d0, &v0, &v1).unwrap();
        assert_eq!(
            v1.decode_row(&d1).unwrap(),
            vec![Value::Long(7), Value::Long(-3), Value::String("eu".into())]
        );
    }

    /// A table added to the log after the snapshot (a version naming a table the manifest has not,
    /// with its primary key) is a table of its own, known by its fingerprint (its changes passed
    /// over); a log that began with one table names that table once it has several.
    #[test]
    fn a_table_added_to_the_log_is_known_and_the_first_table_keeps_its_versions() {
        let v0 = schema(r#"{"name":"id","type":"long"},{"name":"n","type":"int"}"#);
        let e = r#"{"type":"record","name":"E","fields":[{"name":"k","type":"string"}]}"#;
        let t1 = r#"{"type":"record","name":"T","fields":[{"name":"id","type":"long"},{"name":"n","type":"int"},{"name":"x","type":["null","string"],"default":null}]}"#;
        let a = |e: u64, table: Option<&str>, s: &str, key: Option<&str>| AnnouncedVersion {
            source: format!("v@{e}"),
            table: table.map(str::to_string),
            from_epoch: Epoch(e),
            row_schema: s.into(),
            named_fingerprint: None,
            primary_key: key.map(|k| vec![k.to_string()]),
        };
        let vs = SchemaVersions::new(
            std::slice::from_ref(&v0),
            &[None],
            Epoch(10),
            &[a(30, Some("e"), e, Some("k")), a(40, Some("t"), t1, None)],
        )
        .unwrap();
        assert_eq!(vs.table_count(), 2);
        let e_fp = vs.of(1)[0].fingerprint;
        assert_eq!(vs.by_fingerprint(&e_fp), Some((1, 0)));
        assert_eq!(
            vs.of(0).len(),
            2,
            "t's version named once the log has several tables"
        );
        assert_eq!(vs.at(0, Epoch(40)), 1);
        // Without its primary key, an unknown table is refused in a log of several; in a
        // one-table log it is the table's (named by its row record), here an incompatible one.
        let two = [v0.clone(), schema(r#"{"name":"id","type":"long"}"#)];
        let names = [Some("t".to_string()), Some("u".to_string())];
        let err =
            SchemaVersions::new(&two, &names, Epoch(10), &[a(30, Some("e"), e, None)]).unwrap_err();
        assert!(err.to_string().contains("the log has no table e"), "{err}");
        let err = SchemaVersions::new(
            std::slice::from_ref(&v0),
            &[Some("public_t".into())],
            Epoch(10),
            &[a(30, Some("e"), e, None)],
        )
        .unwrap_err();
        assert!(
            matches!(err, SchemaChangeError::Incompatible { .. }),
            "{err}"
        );
        // A version naming no table, in a log of several: the first table's history before a
        // later snapshot; after it, refused.
        let wide = r#"{"type":"record","name":"T","fields":[{"name":"id","type":"long"},{"name":"n","type":"long"}]}"#;
        let vs = SchemaVersions::new(&two, &names, Epoch(50), &[a(40, None, wide, None)]).unwrap();
        assert_eq!(
            vs.of(0)[0].table.json,
            serde_json::from_str::<serde_json::Value>(wide).unwrap()
        );
        let vs = SchemaVersions::new(&two, &names, Epoch(50), &[a(40, None, t1, None)]);
        assert!(
            vs.is_err(),
            "t1's fields are not the snapshot's: checked as history"
        );
        let err =
            SchemaVersions::new(&two, &names, Epoch(10), &[a(40, None, t1, None)]).unwrap_err();
        assert!(
            err.to_string().contains("name the version's table"),
            "{err}"
        );
    }

    /// A job's codec passes over the changes and truncations of a table added to the log after its
    /// snapshot; a truncation of a table the log has not is still refused.
    #[test]
    fn a_codec_passes_over_a_table_added_after_its_snapshot() {
        use crate::core::{LogRecord, Op};
        let v0 = schema(r#"{"name":"id","type":"long"}"#);
        let e = TableSchema::parse(
            r#"{"type":"record","name":"E","fields":[{"name":"k","type":"string"}]}"#,
            &["k".to_string()],
        )
        .unwrap();
        let added = AnnouncedVersion {
            source: "e.json".into(),
            table: Some("e".into()),
            from_epoch: Epoch(30),
            row_schema: e.json.to_string(),
            named_fingerprint: None,
            primary_key: Some(vec!["k".into()]),
        };
        let ev = Evolution::new(
            vec![v0.clone()],
            vec![None],
            Epoch(10),
            Box::new(move || Ok(vec![added.clone()])),
            Box::new(|| 1),
        )
        .unwrap();
        let codec = LogCodec::new(v0).unwrap().with_evolution(Arc::new(ev));
        let datum = e
            .encode_row(&apache_avro::types::Value::Record(vec![(
                "k".into(),
                apache_avro::types::Value::String("x".into()),
            )]))
            .unwrap();
        let key = e.key_of_datum(&datum).unwrap();
        let change = LogCodec::new(e)
            .unwrap()
            .encode_change(Epoch(40), Op::Insert, 3, &datum);
        match codec.decode(&change, Some(&key)).unwrap() {
            LogRecord::Change(c) => assert_eq!((c.table, c.row.value.len()), (1, 0)),
            other => panic!("{other:?}"),
        }
        match codec
            .decode(&LogCodec::encode_truncate(Epoch(40), 1), None)
            .unwrap()
        {
            LogRecord::Truncate(t) => assert_eq!(t.table, 1),
            other => panic!("{other:?}"),
        }
        let err = codec
            .decode(&LogCodec::encode_truncate(Epoch(40), 2), None)
            .unwrap_err();
        assert!(err.to_string().contains("no table 2"), "{err}");
    }

    #[test]
    fn versions_are_ordered_checked_and_looked_up_by_fingerprint_and_epoch() {
        let v0 = schema(r#"{"name":"id","type":"long"},{"name":"n","type":"int"}"#);
        let v1 = r#"{"type":"record","name":"T","fields":[{"name":"id","type":"long"},{"name":"n","type":"long"}]}"#;
        let v2 = r#"{"type":"record","name":"T","fields":[{"name":"id","type":"long"}]}"#;
        let a = |e: u64, s: &str| AnnouncedVersion {
            source: format!("v@{e}"),
            table: None,
            from_epoch: Epoch(e),
            row_schema: s.into(),
            named_fingerprint: None,
            primary_key: None,
        };
        // Announced out of order: sorted by epoch.
        let vs = SchemaVersions::new(
            std::slice::from_ref(&v0),
            &[None],
            Epoch(10),
            &[a(30, v2), a(20, v1)],
        )
        .unwrap();
        assert_eq!(vs.at(0, Epoch(19)), 0);
        assert_eq!(vs.at(0, Epoch(20)), 1);
        assert_eq!(vs.at(0, Epoch(29)), 1);
        assert_eq!(vs.at(0, Epoch(31)), 2);
        assert_eq!(vs.until(0, 1), Some(Epoch(30)));
        let fp = vs.of(0)[2].fingerprint;
        assert_eq!(vs.by_fingerprint(&fp), Some((0, 2)));
        // At or before the snapshot epoch (a later snapshot of a capture): the history the
        // snapshot holds. The last of it is in force at the snapshot and must have the snapshot's
        // fields; the changes after the snapshot carry its fingerprint, read as the manifest's
        // version; the versions after it follow as usual.
        let vs = SchemaVersions::new(
            std::slice::from_ref(&v0),
            &[None],
            Epoch(20),
            &[a(15, v2), a(20, v1), a(30, v2)],
        )
        .unwrap();
        let v1_fp = fingerprint_of(&TableSchema::parse(v1, &["id".to_string()]).unwrap()).unwrap();
        assert_eq!(vs.by_fingerprint(&v1_fp), Some((0, 0)));
        assert_eq!(vs.of(0).len(), 2);
        assert_eq!(vs.at(0, Epoch(29)), 0);
        assert_eq!(vs.at(0, Epoch(30)), 1);
        assert_eq!(
            vs.count(),
            4,
            "every version read is counted (no re-read at each barrier)"
        );
        let e = SchemaVersions::new(
            std::slice::from_ref(&v0),
            &[None],
            Epoch(40),
            &[a(20, v1), a(30, v2)],
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("the snapshot is not of this log")
                && e.to_string().contains("v@30"),
            "{e}"
        );
        // int back to... a change from the version before, not the manifest's: long to int is not.
        let e = SchemaVersions::new(&[v0], &[None], Epoch(10), &[a(20, v1), a(30, r#"{"type":"record","name":"T","fields":[{"name":"id","type":"long"},{"name":"n","type":"int"}]}"#)]).unwrap_err();
        assert!(matches!(e, SchemaChangeError::Incompatible { .. }), "{e}");
        assert!(e.to_string().contains("field n"), "{e}");
    }
}
