-- Webhooks from table changes, with no application code (docs/how-to/triggers.md).
--
-- Every insert of an order publishes order.created, and every update that changes
-- it order.updated, with the new row as the payload — inside the transaction that
-- wrote the row: they commit together, or roll back together. Subscribers get them
-- by type (and tenant, and payload filter) like any published event; one order's
-- events arrive in the order they committed (ordering_key).
--
-- The idempotency key is new for every change: a trigger fires once per change, and
-- the receiver tells two changes apart by it (webhook-id).

CREATE TABLE IF NOT EXISTS orders (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer text NOT NULL,
    total numeric(12, 2) NOT NULL,
    status text NOT NULL DEFAULT 'open'
);

CREATE OR REPLACE FUNCTION orders_webhook() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM poller_publish(
        event_type => CASE TG_OP WHEN 'INSERT' THEN 'order.created' ELSE 'order.updated' END,
        payload => to_jsonb(NEW),
        idempotency_key => format('order:%s:%s', NEW.id, gen_random_uuid()),
        ordering_key => format('order:%s', NEW.id));
    RETURN NULL;  -- an AFTER trigger: the row is written already
END
$$;

CREATE OR REPLACE TRIGGER orders_created
    AFTER INSERT ON orders
    FOR EACH ROW EXECUTE FUNCTION orders_webhook();

CREATE OR REPLACE TRIGGER orders_updated
    AFTER UPDATE ON orders
    FOR EACH ROW WHEN (OLD IS DISTINCT FROM NEW)  -- an update that changed nothing: no event
    EXECUTE FUNCTION orders_webhook();
