-- Feed positions move out of the event rows. The sequencer gave each event its position with
-- an UPDATE: a second version of every event row, with an entry in each of its indexes, and
-- a dead version for vacuum. Now it writes one narrow row per event into `event_positions`,
-- and finds the events still waiting by the transaction that wrote them rather than by a
-- NULL position: each event carries its writer's transaction id (`xact`), and the sequencer
-- keeps the snapshot up to which every committed writer's events are positioned
-- (src/events/sequencer.rs says how).
CREATE TABLE event_positions (
    position  BIGINT PRIMARY KEY,
    event_id  BIGINT NOT NULL
);
-- Positions are written in the order of ids, nearly: a block range summary finds an event's
-- position (a cursor given as an event id, the retention's deletes) at no cost per insert.
CREATE INDEX event_positions_event ON event_positions USING brin (event_id)
    WITH (pages_per_range = 16, autosummarize = on);

INSERT INTO event_positions (position, event_id)
SELECT position, id FROM events WHERE position IS NOT NULL;

-- The writing transaction, top level. Rows written before this migration have none: those
-- already positioned need none, and those waiting get 1, which the first round takes.
ALTER TABLE events ADD COLUMN xact xid8;
UPDATE events SET xact = '1' WHERE position IS NULL;
ALTER TABLE events ALTER COLUMN xact SET DEFAULT pg_current_xact_id();

DROP INDEX events_position;
DROP INDEX events_unpositioned;
DROP INDEX events_occurred;
ALTER TABLE events DROP COLUMN position;
-- The sequencer's queue: the writers it has not yet seen commit, by transaction id.
CREATE INDEX events_xact ON events (xact);
-- The retention's: events are written in time order, so a block range summary suffices.
CREATE INDEX events_occurred ON events USING brin (occurred_at) WITH (autosummarize = on);

-- The sequencer's progress, one row. Every event whose writer is visible in `done` has its
-- position. A set of writers too large for one round is taken in rounds: `seen` bounds it
-- (events visible in `seen` and not in `done`), `resume_after` is the last id positioned
-- and `last_id` the set's highest; all three are NULL between sets.
CREATE TABLE event_sequencer (
    singleton     BOOLEAN PRIMARY KEY DEFAULT true CHECK (singleton),
    done          pg_snapshot NOT NULL,
    seen          pg_snapshot,
    resume_after  BIGINT,
    last_id       BIGINT,
    CHECK ((seen IS NULL) = (resume_after IS NULL) AND (seen IS NULL) = (last_id IS NULL))
);
INSERT INTO event_sequencer (done) VALUES ('1:1:');
