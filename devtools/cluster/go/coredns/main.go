// Command coredns is the test cluster's DNS (devtools/cluster): CoreDNS from its Go module
// with only the plugins the cluster's Corefile uses, so it builds in a fraction of the time
// of the full plugin set. There is no forward plugin on purpose: names outside
// cluster.local get no answer, and no query leaves the machine.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The plugins' order in a server block, as in CoreDNS's plugin.cfg.
var directives = []string{"ready", "health", "errors", "log", "loadbalance", "cache", "kubernetes"}

func main() {
	dnsserver.Directives = directives
	coremain.Run()
}
