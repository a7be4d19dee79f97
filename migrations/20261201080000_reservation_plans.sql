-- The batch functions' statements join a handful of request rows to `orders` and
-- `user_deal_units` by key. PL/pgSQL caches a generic plan per statement on each connection;
-- chosen while those tables are still small (a fresh database, or before autovacuum has
-- analysed them), that plan is a sequential scan with a hash join, and it stays cached as the
-- tables grow, so every batch then reads whole tables (a profile of the backends showed
-- hashing and tuple visibility checks under these functions dominating). Inside these two
-- functions only index lookups are wanted, whatever the statistics say.
ALTER FUNCTION inventory_reserve_batch(text, uuid[], text[], int[], int[], int, int[], boolean)
    SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off;
ALTER FUNCTION orders_place_batch(text, uuid[], text[], text[], bytea[], int[], int[], int[],
                                  boolean, text, text)
    SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off;
