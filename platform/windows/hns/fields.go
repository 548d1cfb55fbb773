package hns

// Fields names fields of HNS objects that HNS may leave out of what it
// returns, or return with another value than the one sent (docs/windows.md,
// "What HNS returns"). The fake HNS leaves them out or changes them on
// request; the backend tracks, per field, whether HNS was seen returning
// it and which values it returns for the values kproxy sends.
type Fields uint32

// The fields.
const (
	FieldProviderAddress Fields = 1 << iota // a remote endpoint's ProviderAddress policy
	FieldPortFlags                          // port mapping Flags
	FieldDistribution                       // port mapping DistributionType
	FieldSourceVIP                          // load balancer SourceVIP
	FieldLBFlags                            // load balancer Flags other than IPv6 (DSR)
	FieldFrontendVIPs                       // load balancer FrontendVIPs
	FieldName                               // endpoint Name
	FieldMAC                                // endpoint MacAddress

	// FieldsUnechoed are the fields nothing shows a real HNS returns
	// (docs/windows.md). Frontend VIPs, names and MACs are returned by
	// the HNS versions upstream kube-proxy runs on (it finds its load
	// balancers by frontend VIP and the root endpoint by name);
	// FieldsAll adds them.
	FieldsUnechoed = FieldProviderAddress | FieldPortFlags | FieldDistribution | FieldSourceVIP | FieldLBFlags

	// FieldsAll is every field HNS may leave out or change.
	FieldsAll = FieldsUnechoed | FieldFrontendVIPs | FieldName | FieldMAC
)

// String names the fields, "PortFlags|SourceVIP".
func (f Fields) String() string {
	names := []string{"ProviderAddress", "PortFlags", "Distribution", "SourceVIP", "LBFlags", "FrontendVIPs", "Name", "MAC"}
	out := ""
	for i, n := range names {
		if f&(1<<i) != 0 {
			if out != "" {
				out += "|"
			}
			out += n
		}
	}
	if out == "" {
		return "none"
	}
	return out
}
