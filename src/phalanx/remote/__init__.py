"""The face over HTTP, as a team server's client: ``RemoteFace`` (``face.py``), the login this
machine keeps (``login.py``), the HTTP client (``client.py``) and what a submit ships (``ship.py``)."""
