//! The scheduling core: given pending pods, existing nodes, in-flight claims, NodePools and their
//! instance types, decide which NodeClaims to create so that every pod fits at the lowest price,
//! with kube-scheduler's constraints. Pure: no I/O, no clock (time is passed in), no logging.
