"""What people and clients reach: the REST API (`api/`), the live pages and their websockets
(`live/`), the visual builder (`builder/`), the admin site and what its pages show
(`admin_site`, `admin_display`), what a run's page draws (`progress`) and the middleware every
request passes (`requestlog`, `csp`, and `onethread`, last).

Entry points: a view, consumer or admin page checks who asks and calls one service of
`engine/`. It may import the engine, `integrations/` (the tool registry the API lists),
`operations/` (health, metrics) and the models; never the store. Only entry points import it
(the app root's urls, asgi and admin; the other apps' admin pages and APIs).
"""
