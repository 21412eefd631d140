DELETE FROM "{table}"
