// Command etcd is a thin wrapper that builds the etcd server from its Go
// module, so tests get an etcd binary without downloading release archives.
// It lives in its own module (see go.mod beside it) to keep etcd's
// dependencies out of kproxy's module.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
