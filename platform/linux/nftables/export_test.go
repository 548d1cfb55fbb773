package nftables

// Internals for the external test package's benchmarks.
var (
	EncodeBatch  = encodeBatch
	MaxBulkElems = maxBulkElems
)
