-- The queue database's identity (a new user's trial: `inturn local --dsn` had no restore
-- witness, so a dump restored into a database of its own was sent again unnoticed). A random
-- id made once with the clock's row: a dump, a base backup or a replica carries it along, a
-- database made anew gets its own. `inturn local --dsn` keeps one witness per id in its data
-- folder, so a restore of the same database is noticed and a new, empty database is not
-- taken for one.
ALTER TABLE inturn_clock ADD COLUMN IF NOT EXISTS database_id uuid NOT NULL
    DEFAULT gen_random_uuid();
