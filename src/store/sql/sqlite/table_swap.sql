DROP TABLE "{table}"; ALTER TABLE "{next}" RENAME TO "{table}";
