DELETE FROM "{table}" t USING UNNEST($1::int[], $2::bytea[]) AS d(v, k) WHERE t._kb_vnode = d.v AND t._kb_key = d.k
