package images

import (
	"path/filepath"

	"github.com/kproxy/kproxy/hack/image"
)

// Names of the images, as upstream's e2e suite (test/utils/image/manifest.go
// of k8s.io/kubernetes v1.37.2), kubeadm and the kubelet name them.
const (
	Pause       = "registry.k8s.io/pause:3.10.2"
	Agnhost     = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
	AgnhostPrev = "registry.k8s.io/e2e-test-images/agnhost:2.55"
	BusyBox     = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2"
	Nginx       = "registry.k8s.io/e2e-test-images/nginx:1.27.0-2"
	NginxNew    = "registry.k8s.io/e2e-test-images/nginx:1.28.0-2"
	GlibcDNS    = "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1"
	Regression  = "registry.k8s.io/e2e-test-images/regression-issue-74839:1.5"
	CoreDNS     = "registry.k8s.io/coredns/coredns:v1.14.6"
	KubeProxy   = "registry.k8s.io/kube-proxy:v1.37.2"
	// DistrolessIptables is the privileged host-network pod of "should set
	// TCP CLOSE_WAIT timeout", which reads the node's conntrack table.
	DistrolessIptables = "registry.k8s.io/build-image/distroless-iptables:v0.9.9"
	busyboxPkg         = "busybox-static"
	defaultNSSwch      = "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nservices: files\nprotocols: files\n"
)

// Programs are the binaries the images carry (test/controlplane builds them).
type Programs struct {
	Pause      string // kpt-pause (test/cluster/cmd/kpt-pause)
	Agnhost    string
	Regression string // regression-issue-74839
	CoreDNS    string
	KubeProxy  string
	// AgnhostSource is k8s.io/kubernetes's test/images/agnhost directory in
	// the module cache (for porter's certificate and key).
	AgnhostSource string
}

// passwd and group: root, nobody, and what an image's programs or tests
// expect (agnhost: user-defined-in-image 1000 in group-defined-in-image
// 50000; nginx: www-data).
func accounts(extraUsers, extraGroups string) []File {
	return []File{
		{Dst: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/bin/sh\n" + extraUsers + "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")},
		{Dst: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\n" + extraGroups + "nogroup:x:65534:\n")},
		{Dst: "/etc/nsswitch.conf", Mode: 0o644, Data: []byte(defaultNSSwch)},
	}
}

const nginxConf = `# make cluster's nginx test image: port 80, a static page, logs to the
# container's output.
user www-data;
worker_processes 1;
pid /run/nginx.pid;
error_log /dev/stderr;
events { worker_connections 1024; }
http {
	include /etc/nginx/mime.types;
	access_log /dev/stdout;
	server {
		listen 80;
		root /usr/share/nginx/html;
		index index.html;
	}
}
`

// Specs are the images make cluster imports into every node: the e2e
// suite's (agnhost, busybox, nginx, glibc-dns-testing, the conntrack
// regression server), the pod sandbox, CoreDNS and upstream kube-proxy.
// kproxy's own image is make images'.
func Specs(p Programs) []Spec {
	agnhost := Spec{
		Name: "agnhost",
		Refs: []string{Agnhost, AgnhostPrev},
		// Upstream's is Alpine with these tools; here Debian's, with
		// busybox for the rest of the commands Alpine has.
		Packages: []string{"bash", "curl", "netcat-openbsd", "iproute2", "bind9-dnsutils", "socat", "iperf", "libc-bin", "dash", "wget", busyboxPkg},
		Busybox:  true,
		Files: append(accounts("user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n",
			"user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n"),
			File{Src: p.Agnhost, Dst: "/agnhost", Mode: 0o755},
			// The e2e suite's DNS tests run /coredns -conf with a Corefile
			// of hosts and log (upstream's agnhost image has CoreDNS).
			File{Src: p.CoreDNS, Dst: "/coredns", Mode: 0o755},
			File{Src: filepath.Join(p.AgnhostSource, "porter", "localhost.crt"), Dst: "/localhost.crt", Mode: 0o644},
			File{Src: filepath.Join(p.AgnhostSource, "porter", "localhost.key"), Dst: "/localhost.key", Mode: 0o644},
		),
		// nc is netcat-openbsd, as in upstream's image (the suite runs nc -v -t -w):
		// Debian makes /bin/nc an alternative in its postinst, which an
		// unpacked package does not run, and busybox's nc would take its place.
		// /bin/sh is dash: Debian's static busybox, as sh, runs its own
		// applets before the commands in PATH (its nc, not netcat-openbsd's).
		// wget is GNU wget: Debian's static busybox's wget segfaults (its
		// static glibc loading the image's NSS modules, seemingly), even for
		// an address.
		Symlinks: map[string]string{"/agnhost-2": "agnhost", "/usr/local/bin/iperf": "/usr/bin/iperf",
			"/bin/nc": "nc.openbsd", "/bin/netcat": "nc.openbsd", "/bin/sh": "dash"},
		Dirs:       []image.Dir{{Name: "uploads", Mode: 0o755}},
		Entrypoint: []string{"/agnhost"},
		Cmd:        []string{"pause"},
		Why: "Debian's bash, curl, netcat-openbsd, iproute2, dig (bind9-dnsutils, glibc where upstream's is musl), socat, " +
			"iperf (2.1.8, not 2.2) and busybox in place of Alpine's; the cluster's CoreDNS build (kubeadm's plugins and hosts) as /coredns; no fake registry; agnhost:2.55 is the same image under the older tag",
	}
	return []Spec{
		{
			Name:       "pause",
			Refs:       []string{Pause},
			Files:      []File{{Src: p.Pause, Dst: "/pause", Mode: 0o755}},
			Entrypoint: []string{"/pause"},
			Why:        "kpt-pause (Go) in place of upstream's C pause: same job (hold the namespaces, reap, exit on SIGTERM)",
		},
		agnhost,
		{
			Name:     "busybox",
			Refs:     []string{BusyBox},
			Packages: []string{busyboxPkg},
			Busybox:  true,
			Files:    accounts("", ""),
			Cmd:      []string{"sh"},
			Why:      "Debian's busybox-static (1.35) in place of busybox 1.37",
		},
		{
			Name:     "nginx",
			Refs:     []string{Nginx, NginxNew},
			Packages: []string{"nginx"},
			Files: append(accounts("www-data:x:33:33:www-data:/var/www:/usr/sbin/nologin\n", "www-data:x:33:\n"),
				File{Dst: "/etc/nginx/nginx.conf", Mode: 0o644, Data: []byte(nginxConf)},
				File{Dst: "/usr/share/nginx/html/index.html", Mode: 0o644, Data: []byte("<!DOCTYPE html>\n<html><head><title>Welcome to nginx!</title></head><body><h1>Welcome to nginx!</h1></body></html>\n")},
			),
			Dirs:       []image.Dir{{Name: "var/log/nginx", Mode: 0o755}, {Name: "var/lib/nginx", Mode: 0o755}, {Name: "run", Mode: 0o755}},
			Entrypoint: []string{"/usr/sbin/nginx", "-g", "daemon off;"},
			Why:        "Debian's nginx 1.22 serving a static page on port 80; 1.28.0-2 is the same image under the newer tag",
		},
		{
			Name:       "glibc-dns-testing",
			Refs:       []string{GlibcDNS},
			Packages:   []string{"bash", "dash", "coreutils", "grep", "sed", "bind9-dnsutils", "libc-bin"},
			Files:      accounts("", ""),
			Symlinks:   map[string]string{"/bin/sh": "dash"},
			Entrypoint: []string{"/bin/sh"},
			Why:        "Debian bookworm with dig, as upstream's, without its coredns binary",
		},
		{
			Name:       "regression-issue-74839",
			Refs:       []string{Regression},
			Files:      []File{{Src: p.Regression, Dst: "/regression-issue-74839", Mode: 0o755}},
			Entrypoint: []string{"/regression-issue-74839"},
			Why:        "the same program, built from k8s.io/kubernetes v1.37.2",
		},
		{
			Name:       "coredns",
			Refs:       []string{CoreDNS},
			Files:      []File{{Src: p.CoreDNS, Dst: "/coredns", Mode: 0o755}},
			Entrypoint: []string{"/coredns"},
			Why:        "CoreDNS v1.14.6 with the plugins of kubeadm's Corefile only (test/controlplane/modules/coredns)",
		},
		{
			Name: "distroless-iptables",
			Refs: []string{DistrolessIptables},
			// The suite runs sleep, then sh -c with test, cat, grep, which
			// and conntrack -L.
			Packages:     []string{"dash", "conntrack", "iptables", busyboxPkg},
			Busybox:      true,
			Alternatives: true,
			Files:        accounts("", ""),
			Symlinks:     map[string]string{"/bin/sh": "dash"},
			Why:          "Debian's iptables (nft alternative) and conntrack, with dash and busybox for the shell commands the suite runs in it",
		},
		{
			Name:         "kube-proxy",
			Refs:         []string{KubeProxy},
			Packages:     image.Packages,
			Alternatives: true,
			Files:        []File{{Src: p.KubeProxy, Dst: "/usr/local/bin/kube-proxy", Mode: 0o755}},
			Entrypoint:   []string{"/usr/local/bin/kube-proxy"},
			Why:          "upstream kube-proxy v1.37.2 on kproxy's image packages (iptables with the nft alternative, nftables, conntrack, ipset)",
		},
	}
}
