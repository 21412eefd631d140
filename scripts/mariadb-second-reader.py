#!/usr/bin/env python3
"""A second reader of a MariaDB binlog, written by nobody here: PyPI's mysql-replication decodes
the row events of one table from a MariaDB GTID position (`@@gtid_binlog_pos` read before the
table was created; by default the oldest binary log the server still has), this script
applies them (and TRUNCATE statements) to a table keyed by its primary key, then compares the
result, value by value, with the typed columns of a kafka-backfill SQLite replica of that table.

    mariadb-second-reader.py --port 13306 --database D --table T --replica FILE [--replica-table R]
                             [--from-gtid G]   (e.g. 0-1-42: @@gtid_binlog_pos before the table)

Prints one line per difference (at most 20) and a summary; exits 1 if anything differs. The
server must log `binlog_row_metadata = FULL` while the table is written (column names, enum and
set labels come from it). Values are compared in the replica's forms (docs/CAPTURE.md, "MariaDB",
the types table): integers, decimals as their text, dates as days and datetimes, timestamps and
times as microseconds, enums as their label, sets as their labels, bits as integers, bytes as bytes.
"""
import argparse
import datetime
import decimal
import os
import sqlite3
import sys

os.environ["TZ"] = "UTC"  # mysql-replication reads a timestamp as local time

import pymysql  # noqa: E402  (after TZ)
from pymysqlreplication import BinLogStreamReader  # noqa: E402
from pymysqlreplication.event import QueryEvent  # noqa: E402
from pymysqlreplication.row_event import (  # noqa: E402
    DeleteRowsEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

EPOCH = datetime.datetime(1970, 1, 1)


def normal(v, set_order):
    """A binlog value in the replica's form."""
    if v is None or isinstance(v, (int, float, bytes)):
        return v
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, datetime.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        return (v - EPOCH) // datetime.timedelta(microseconds=1)
    if isinstance(v, datetime.date):
        return (v - EPOCH.date()).days
    if isinstance(v, datetime.timedelta):
        return v // datetime.timedelta(microseconds=1)
    if isinstance(v, (set, frozenset)):
        return ",".join(label for label in set_order if label in v)
    return v


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--port", type=int, required=True)
    a.add_argument("--database", required=True)
    a.add_argument("--table", required=True)
    a.add_argument("--replica", required=True)
    a.add_argument("--replica-table")
    a.add_argument("--from-gtid")
    args = a.parse_args()
    conn = {"host": "127.0.0.1", "port": args.port, "user": "root", "password": ""}

    # The catalog: the key, the columns' types (a set's labels in definition order, a bit field,
    # an unsigned bigint, which the replica holds as a decimal's text).
    c = pymysql.connect(**conn)
    with c.cursor() as cur:
        cur.execute(
            "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, COLUMN_KEY FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
            (args.database, args.table),
        )
        columns = cur.fetchall()
        cur.execute("SHOW BINARY LOGS")
        first_log, first_pos = cur.fetchall()[0][0], 4
    c.close()
    # mysql-replication asks a MariaDB server for a GTID position (a file and offset it does not
    # send): from a GTID, or from the start of the oldest binary log.
    start = {"auto_position": args.from_gtid} if args.from_gtid else {
        "log_file": first_log, "log_pos": first_pos, "resume_stream": True}
    key = [name for name, _, _, k in columns if k == "PRI"]
    kinds = {name: (dt, ct) for name, dt, ct, _ in columns}
    set_orders = {
        name: [label[1:-1].replace("''", "'") for label in ct[4:-1].split(",")]
        for name, (dt, ct) in kinds.items()
        if dt == "set"
    }

    def row_form(values):
        out = {}
        for name, (dt, ct) in kinds.items():
            v = values.get(name)
            if dt == "bit" and isinstance(v, str):
                v = int(v, 2)
            elif dt == "set" and v is None:
                # mysql-replication reads an empty set as None (the tests' set columns are never
                # NULL).
                v = set()
            elif dt == "bigint" and "unsigned" in ct and v is not None:
                v = str(v)
            out[name] = normal(v, set_orders.get(name, []))
        return out

    table = {}
    events = rows = 0
    stream = BinLogStreamReader(
        connection_settings=conn,
        server_id=0x7EAD_0001,
        blocking=False,
        is_mariadb=True,
        **start,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, QueryEvent],
        # Row events of other tables are passed over undecoded.
        only_tables=[args.table],
        only_schemas=[args.database],
    )
    for ev in stream:
        if isinstance(ev, QueryEvent):
            words = ev.query.replace("`", " ").replace(".", " ").split()
            if (
                words[:1] and words[0].upper() == "TRUNCATE"
                and args.table in words
                and (ev.schema.decode() if isinstance(ev.schema, bytes) else ev.schema) == args.database
            ):
                table.clear()
            continue
        if ev.schema != args.database or ev.table != args.table:
            continue
        events += 1
        for r in ev.rows:
            rows += 1
            if isinstance(ev, WriteRowsEvent):
                v = row_form(r["values"])
                table[tuple(v[k] for k in key)] = v
            elif isinstance(ev, DeleteRowsEvent):
                v = row_form(r["values"])
                del table[tuple(v[k] for k in key)]
            else:
                b, v = row_form(r["before_values"]), row_form(r["after_values"])
                del table[tuple(b[k] for k in key)]
                table[tuple(v[k] for k in key)] = v
    stream.close()

    # The replica's typed columns.
    db = sqlite3.connect(f"file:{args.replica}?mode=ro", uri=True)
    names = list(kinds)
    replica = {}
    quoted = ", ".join(f'"{n}"' for n in names)
    for values in db.execute(f'SELECT {quoted} FROM "{args.replica_table or args.table}"'):
        v = dict(zip(names, values))
        replica[tuple(v[k] for k in key)] = v

    differences = []
    for k in sorted(set(table) | set(replica), key=repr):
        mine, theirs = table.get(k), replica.get(k)
        if mine is None or theirs is None:
            differences.append(f"key {k}: binlog {mine!r}, replica {theirs!r}")
            continue
        for n in names:
            a_, b_ = mine[n], theirs[n]
            if isinstance(a_, float) and isinstance(b_, (int, float)):
                same = abs(a_ - b_) <= 1e-6 * max(1.0, abs(a_))
            else:
                same = a_ == b_
            if not same:
                differences.append(f"key {k} column {n}: binlog {a_!r}, replica {b_!r}")
    for d in differences[:20]:
        print(d)
    print(
        f"second reader: {events} row events ({rows} rows) of {args.database}.{args.table} from "
        f"{args.from_gtid or first_log}, {len(table)} rows; replica {len(replica)} rows; {len(differences)} differences"
    )
    sys.exit(1 if differences else 0)


if __name__ == "__main__":
    main()
