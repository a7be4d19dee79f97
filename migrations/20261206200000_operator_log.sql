-- Every change an operator makes (through the admin API or the CLI), with who made it:
-- the provider token's user claim, `admin-token` for the static bootstrap token, or
-- `cli:<login>` for the command line. Append-only; `id` is the reading cursor.
CREATE TABLE operator_log (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    who text NOT NULL,
    action text NOT NULL,
    target text NOT NULL,
    detail jsonb NOT NULL DEFAULT '{}'::jsonb
);
