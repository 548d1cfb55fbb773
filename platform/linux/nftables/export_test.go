package nftables

// SetKind says whether the named set of kproxy's table is a "set" or a
// "map", from the schema the netlink encoder knows (for the external tests).
func SetKind(set string) string {
	if sc, _ := schemaOf(set); sc.verdict || len(sc.value) > 0 {
		return "map"
	}
	return "set"
}
