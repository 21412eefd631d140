SELECT to_regclass(quote_ident($1)) IS NOT NULL
