"""Reverb as the store and the transport: servers, tables, writers, pushes.

`network` (addresses, deadlines on every client call, the one
`ServerUnavailableError`), `tables` (table signatures, servers,
checkpoints), `writers` (window and episode writers), `push` (RLDS ->
table, fast), `server_link` (reconnecting to a restarted server), `shards`
(splitting a push over processes). Knows nothing of learners.
"""
