"""The actors' protocol: their messages (messages.py), their faces (api.py: BrokerApi, AuthorityApi), the
one codec of the wire (codec.py) and the remote proxies and handler tables derived from the faces
(remote.py). Every actor imports the others only through this package."""
