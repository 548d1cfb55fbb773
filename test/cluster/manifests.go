package cluster

import (
	"fmt"
	"strings"

	"github.com/kproxy/kproxy/test/cluster/images"
)

// Proxies make cluster can run.
const (
	// ProxyKproxy is kproxy from deploy/ (kubectl apply -k), its image from
	// make images.
	ProxyKproxy = "kproxy"
	// ProxyKubeProxy is upstream kube-proxy v1.37.2 as kubeadm deploys it.
	ProxyKubeProxy = "kube-proxy"
	// ProxyNone is a cluster without a Service proxy, for a user (or a
	// test: hack/tools' TestChartOnCluster) to install one, with Helm for
	// example. make images' kproxy image is imported in the nodes all the
	// same; MODE only sets kube-proxy's ConfigMap. Nothing reaches a
	// ClusterIP until a proxy runs, CoreDNS's connection to the API server
	// included: it is not waited for.
	ProxyNone = "none"
)

// Modes are the Linux proxy modes both proxies have.
var Modes = []string{"iptables", "nftables"}

// CheckProxy validates a PROXY and MODE pair.
func CheckProxy(proxy, mode string) error {
	if proxy != ProxyKproxy && proxy != ProxyKubeProxy && proxy != ProxyNone {
		return fmt.Errorf("PROXY=%q: want %s, %s or %s", proxy, ProxyKproxy, ProxyKubeProxy, ProxyNone)
	}
	for _, m := range Modes {
		if m == mode {
			return nil
		}
	}
	return fmt.Errorf("MODE=%q: want one of %s", mode, strings.Join(Modes, ", "))
}

// KubeProxyConfigMap is kube-system/kube-proxy as kubeadm writes it (its two
// files, config.conf and kubeconfig.conf), in the given mode. It is there
// whichever proxy runs: kube-proxy reads it, and deploy/overlays/kubeadm
// takes kproxy's API server and pod CIDR from it, as on a kubeadm cluster.
// conntrack.maxPerCore 0 leaves nf_conntrack_max alone: it is host-wide,
// and writable only from the machine's own namespace (kind does the same).
func KubeProxyConfigMap(mode, apiServer string) string {
	return `apiVersion: v1
kind: ConfigMap
metadata:
  name: kube-proxy
  namespace: kube-system
  labels:
    app: kube-proxy
data:
  kubeconfig.conf: |-
    apiVersion: v1
    kind: Config
    clusters:
    - cluster:
        certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
        server: ` + apiServer + `
      name: default
    contexts:
    - context:
        cluster: default
        namespace: default
        user: default
      name: default
    current-context: default
    users:
    - name: default
      user:
        tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
  config.conf: |-
    apiVersion: kubeproxy.config.k8s.io/v1alpha1
    kind: KubeProxyConfiguration
    bindAddress: 0.0.0.0
    clientConnection:
      kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
    clusterCIDR: ` + ClusterCIDR.String() + `
    conntrack:
      maxPerCore: 0
    healthzBindAddress: 0.0.0.0:10256
    metricsBindAddress: 127.0.0.1:10249
    mode: ` + mode + `
    winkernel:
      networkName: ""
`
}

// KubeProxyManifest is upstream kube-proxy's service account, its binding to
// the bootstrap role system:node-proxier, and its DaemonSet, as kubeadm's
// kube-proxy add-on makes them (privileged, host network, the ConfigMap,
// the xtables lock).
func KubeProxyManifest() string {
	return `apiVersion: v1
kind: ServiceAccount
metadata:
  name: kube-proxy
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kubeadm:node-proxier
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:node-proxier
subjects:
- kind: ServiceAccount
  name: kube-proxy
  namespace: kube-system
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: kube-proxy
  namespace: kube-system
  labels:
    k8s-app: kube-proxy
spec:
  selector:
    matchLabels:
      k8s-app: kube-proxy
  updateStrategy:
    type: RollingUpdate
  template:
    metadata:
      labels:
        k8s-app: kube-proxy
    spec:
      priorityClassName: system-node-critical
      serviceAccountName: kube-proxy
      hostNetwork: true
      nodeSelector:
        kubernetes.io/os: linux
      tolerations:
      - operator: Exists
      containers:
      - name: kube-proxy
        image: ` + images.KubeProxy + `
        imagePullPolicy: IfNotPresent
        command:
        - /usr/local/bin/kube-proxy
        - --config=/var/lib/kube-proxy/config.conf
        - --hostname-override=$(NODE_NAME)
        env:
        - name: NODE_NAME
          valueFrom:
            fieldRef:
              fieldPath: spec.nodeName
        securityContext:
          privileged: true
        volumeMounts:
        - name: kube-proxy
          mountPath: /var/lib/kube-proxy
        - name: xtables-lock
          mountPath: /run/xtables.lock
        - name: lib-modules
          mountPath: /lib/modules
          readOnly: true
      volumes:
      - name: kube-proxy
        configMap:
          name: kube-proxy
      - name: xtables-lock
        hostPath:
          path: /run/xtables.lock
          type: FileOrCreate
      - name: lib-modules
        hostPath:
          path: /lib/modules
`
}

// CoreDNSManifest is the cluster DNS as kubeadm installs it: CoreDNS (two
// replicas) with kubeadm's Corefile behind the kube-dns Service at DNSIP,
// its service account and the read access it needs.
func CoreDNSManifest() string {
	return `apiVersion: v1
kind: ServiceAccount
metadata:
  name: coredns
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:coredns
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:coredns
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:coredns
subjects:
- kind: ServiceAccount
  name: coredns
  namespace: kube-system
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: coredns
  namespace: kube-system
data:
  Corefile: |
    .:53 {
        errors
        health {
           lameduck 5s
        }
        ready
        kubernetes ` + DNSDomain + ` in-addr.arpa ip6.arpa {
           pods insecure
           fallthrough in-addr.arpa ip6.arpa
           ttl 30
        }
        prometheus :9153
        forward . /etc/resolv.conf {
           max_concurrent 1000
        }
        cache 30 {
           disable success ` + DNSDomain + `
           disable denial ` + DNSDomain + `
        }
        loop
        reload
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels:
    k8s-app: kube-dns
spec:
  replicas: 2
  selector:
    matchLabels:
      k8s-app: kube-dns
  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxUnavailable: 1
  template:
    metadata:
      labels:
        k8s-app: kube-dns
    spec:
      priorityClassName: system-cluster-critical
      serviceAccountName: coredns
      dnsPolicy: Default
      nodeSelector:
        kubernetes.io/os: linux
      tolerations:
      - key: CriticalAddonsOnly
        operator: Exists
      affinity:
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            podAffinityTerm:
              labelSelector:
                matchLabels:
                  k8s-app: kube-dns
              topologyKey: kubernetes.io/hostname
      containers:
      - name: coredns
        image: ` + images.CoreDNS + `
        imagePullPolicy: IfNotPresent
        args: ["-conf", "/etc/coredns/Corefile"]
        resources:
          limits:
            memory: 170Mi
          requests:
            cpu: 100m
            memory: 70Mi
        ports:
        - {name: dns, containerPort: 53, protocol: UDP}
        - {name: dns-tcp, containerPort: 53, protocol: TCP}
        - {name: metrics, containerPort: 9153, protocol: TCP}
        livenessProbe:
          httpGet: {path: /health, port: 8080, scheme: HTTP}
          initialDelaySeconds: 60
          timeoutSeconds: 5
          failureThreshold: 5
        readinessProbe:
          httpGet: {path: /ready, port: 8181, scheme: HTTP}
        securityContext:
          allowPrivilegeEscalation: false
          capabilities:
            add: [NET_BIND_SERVICE]
            drop: [ALL]
          readOnlyRootFilesystem: true
        volumeMounts:
        - name: config-volume
          mountPath: /etc/coredns
          readOnly: true
      volumes:
      - name: config-volume
        configMap:
          name: coredns
          items:
          - key: Corefile
            path: Corefile
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels:
    k8s-app: kube-dns
    kubernetes.io/name: CoreDNS
  annotations:
    prometheus.io/port: "9153"
    prometheus.io/scrape: "true"
spec:
  selector:
    k8s-app: kube-dns
  clusterIP: ` + DNSIP.String() + `
  ports:
  - {name: dns, port: 53, protocol: UDP, targetPort: 53}
  - {name: dns-tcp, port: 53, protocol: TCP, targetPort: 53}
  - {name: metrics, port: 9153, protocol: TCP, targetPort: 9153}
`
}
