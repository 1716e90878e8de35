"""The Slice Exchange Point (SEP, Tarui et al., IM 2015; ../shared/FEDERATION.md §4): one AM API v3 endpoint
through which a slice spans testbeds. Pure core: `split` (request by aggregate, cross-domain links), `txn`
(allocate everywhere, then provision; roll back on any failure, and after a crash), `merge` (manifests and
advertisements as one document). I/O edge: `relay` (the domains' AMs over mutual TLS), `service` (the endpoint,
the durable slice record, recovery), `overlay` (joining a link where no layer-2 path exists), `sdk`."""
