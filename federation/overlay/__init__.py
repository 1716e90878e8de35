"""An IPOP-style overlay for slices that span testbeds with no layer-2 path between them.

Each slice is an overlay namespace (an address range and a lease time). A node claims an address with an
atomic put-if-absent of (namespace, address) in the shared store, renews it at a quarter of the lease and
releases it on leave; an expired claim is free again. Nodes on one segment talk directly; a per-cluster
virtual router answers ARP for remote addresses and tunnels Ethernet frames over UDP to the router of the
cluster that holds the destination's claim.

`core` and `frames` are the pure parts (pool, lease state machine, routing and proxy-ARP decisions, frame
codecs); `claims` is the Redis edge, `keeper` drives a lease against it, `tap` and `router` are the host
edges (tap devices in network namespaces, the userspace forwarder)."""
