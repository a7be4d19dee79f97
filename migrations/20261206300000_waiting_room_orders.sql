-- Orders placed with a waiting-room pass, so a deal's report counts from PostgreSQL how
-- many admitted buyers ordered and how many of those orders were paid.
CREATE TABLE waiting_room_orders (
    order_id  uuid PRIMARY KEY REFERENCES orders (id),
    deal_id   text NOT NULL,
    user_id   text NOT NULL,
    pass_id   text NOT NULL,
    placed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX waiting_room_orders_deal ON waiting_room_orders (deal_id);
