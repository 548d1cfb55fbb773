// Command coredns is CoreDNS with the plugins of kubeadm's default Corefile,
// plus hosts, and nothing else (no cloud DNS providers, no etcd, no dnstap):
// the cluster DNS of make cluster, run as the kube-system/coredns Deployment
// behind the kube-dns Service, and /coredns of the agnhost image, which the
// e2e suite's DNS tests run as a server of their own with a Corefile of
// hosts and log.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// directives is the order in which the plugins see a query: the relative
// order of CoreDNS's plugin.cfg, restricted to the plugins linked in above.
var directives = []string{
	"reload",
	"ready",
	"health",
	"prometheus",
	"errors",
	"log",
	"loadbalance",
	"cache",
	"hosts",
	"kubernetes",
	"loop",
	"forward",
}

func main() {
	dnsserver.Directives = directives
	coremain.Run()
}
