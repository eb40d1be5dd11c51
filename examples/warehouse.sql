-- Sample rows for the orders-digest example, loaded into var/examples/warehouse.sqlite3 by
-- `make run` (manage.py stepwise_bootstrap) when that file does not exist yet.
CREATE TABLE orders (
  id TEXT PRIMARY KEY,
  region TEXT NOT NULL,
  customer TEXT NOT NULL,
  total_usd NUMERIC NOT NULL,
  status TEXT NOT NULL
);
INSERT INTO orders VALUES
  ('ORD-2001', 'EU', 'Ann Berg', 120.50, 'open'),
  ('ORD-2002', 'EU', 'Bo Lind', 980.00, 'on_hold'),
  ('ORD-2003', 'EU', 'Cy Moreau', 42.10, 'closed'),
  ('ORD-2004', 'EU', 'Dee Novak', 310.00, 'open'),
  ('ORD-2005', 'US', 'Eli Park', 75.00, 'open'),
  ('ORD-2006', 'US', 'Fay Quinn', 1500.00, 'on_hold'),
  ('ORD-2007', 'APAC', 'Gus Rao', 64.99, 'open');
