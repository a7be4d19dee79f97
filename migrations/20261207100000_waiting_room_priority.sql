-- A priority group with a share of a line's admissions:
-- `{"claim": name, "values": [...], "codes": bool, "share_percent": 1-99}`; NULL for none.
ALTER TABLE deals ADD COLUMN wr_priority jsonb;
