-- Who may join a deal's line: `{"claim": name, "values": [...]}` and/or `{"codes": true}`;
-- NULL lets everyone in.
ALTER TABLE deals ADD COLUMN wr_invitation jsonb;

-- Access codes of a deal's line, issued by an operator and shown once: only the SHA-256 of
-- each code is kept. A code is redeemed by one user (`redeemed_by`), who may use it again
-- to join again; nobody else can.
CREATE TABLE access_codes (
    deal_id text NOT NULL REFERENCES deals (id) ON DELETE CASCADE,
    code_sha256 bytea NOT NULL CHECK (length(code_sha256) = 32),
    issued_at timestamptz NOT NULL DEFAULT now(),
    redeemed_by text,
    redeemed_at timestamptz,
    PRIMARY KEY (deal_id, code_sha256),
    CHECK ((redeemed_by IS NULL) = (redeemed_at IS NULL))
);
CREATE INDEX access_codes_redeemer ON access_codes (deal_id, redeemed_by)
    WHERE redeemed_by IS NOT NULL;
