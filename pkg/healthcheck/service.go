package healthcheck

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// ReasonFailedToStart is the reason reported for a health check node port
// that cannot be served (upstream's Event reason).
const ReasonFailedToStart = "FailedToStartServiceHealthcheck"

// WeightHeader carries the number of local endpoints in every answer, for
// load balancers that weight nodes by it (as upstream sets it).
const WeightHeader = "X-Load-Balancing-Endpoint-Weight"

// ServiceHealth is what one Service's health check node port serves.
type ServiceHealth struct {
	// Port is the Service's healthCheckNodePort.
	Port int32
	// LocalEndpoints is the number of ready endpoints of the Service on this
	// node.
	LocalEndpoints int
}

// ServiceOptions configure ServiceServers.
type ServiceOptions struct {
	// IPs are the addresses each health check node port listens on, one
	// listener per address (tcp4 for IPv4, tcp6 for IPv6, so 0.0.0.0 and ::
	// can both be served). Empty means one listener per port on every
	// address of every family, until SetIPs.
	IPs []netip.Addr
	// Listen opens a listener; defaults to net.Listen.
	Listen func(network, address string) (net.Listener, error)
	// Healthy reports whether the proxy programs changes in time
	// (ProxyHealth.Healthy); nil means always.
	Healthy func() bool
	// Report is told, once per Service and port until that port is served or
	// the Service no longer asks for it, that a port cannot be served.
	Report func(svc types.NamespacedName, reason, message string)
	// Logger defaults to klog's global logger.
	Logger *klog.Logger
}

// ServiceServers runs one HTTP server per Service health check node port.
// It is safe for concurrent use.
type ServiceServers struct {
	opts ServiceOptions
	log  klog.Logger

	mu       sync.RWMutex
	services map[types.NamespacedName]*instance
	// failed holds what each Service whose port could not be served asked
	// for (already reported); owner the Service serving each port.
	failed map[types.NamespacedName]ServiceHealth
	owner  map[int32]types.NamespacedName
	closed bool
	// explicit is set by SetIPs: opts.IPs is the list even when empty.
	explicit bool
}

type instance struct {
	port      int32
	endpoints int
	servers   []*http.Server
}

// NewServiceServers returns servers with nothing to serve yet.
func NewServiceServers(o ServiceOptions) *ServiceServers {
	if o.Listen == nil {
		o.Listen = net.Listen
	}
	s := &ServiceServers{opts: o, log: klog.Background(),
		services: map[types.NamespacedName]*instance{}, failed: map[types.NamespacedName]ServiceHealth{},
		owner: map[int32]types.NamespacedName{}}
	if o.Logger != nil {
		s.log = *o.Logger
	}
	return s
}

// SetIPs sets the addresses the ports opened from now on listen on. Unlike
// ServiceOptions.IPs, an empty list means no address at all: as upstream, a
// health check node port is then served nowhere (nodePortAddresses matches
// no local address of the family).
func (s *ServiceServers) SetIPs(ips []netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opts.IPs = slices.Clone(ips)
	s.explicit = true
}

// Update makes the servers match want: it closes the ports of Services gone
// or moved, opens new ones (retrying those that failed before) and updates
// the local endpoint counts. A port that cannot be opened, or that another
// Service already uses, is reported and skipped; the others are unaffected.
func (s *ServiceServers) Update(want map[types.NamespacedName]ServiceHealth) {
	s.mu.RLock()
	names := make([]types.NamespacedName, 0, len(want)+len(s.services))
	for name := range s.services {
		names = append(names, name)
	}
	for name := range s.failed {
		names = append(names, name)
	}
	s.mu.RUnlock()
	for name := range want {
		names = append(names, name)
	}
	s.UpdateSome(names, want)
}

// UpdateSome is Update for the Services in names only (want holds those of
// them that have a port; the others' ports are closed): the app's partial
// syncs name the Services whose ports changed, so that the cost does not
// grow with the number of health check node ports. The ports that failed
// before are retried whether named or not.
func (s *ServiceServers) UpdateSome(names []types.NamespacedName, want map[types.NamespacedName]ServiceHealth) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	named := make(map[types.NamespacedName]bool, len(names))
	for _, name := range names {
		named[name] = true
	}
	for name := range named {
		w, ok := want[name]
		if inst := s.services[name]; inst != nil && (!ok || w.Port != inst.port) {
			s.log.V(2).Info("Closing health check node port", "service", name.String(), "port", inst.port)
			inst.close()
			delete(s.services, name)
			if s.owner[inst.port] == name {
				delete(s.owner, inst.port)
			}
		}
		if f, failed := s.failed[name]; failed && (!ok || w.Port != f.Port) {
			delete(s.failed, name)
		}
	}
	// What to serve: the named Services that have a port, and the failed
	// ones again (with what they asked for then, unless named).
	todo := map[types.NamespacedName]ServiceHealth{}
	for name := range named {
		if w, ok := want[name]; ok {
			todo[name] = w
		}
	}
	for name, f := range s.failed {
		if !named[name] {
			todo[name] = f
		}
	}
	order := make([]types.NamespacedName, 0, len(todo))
	for name := range todo {
		order = append(order, name)
	}
	sort.Slice(order, func(i, j int) bool { return order[i].String() < order[j].String() })
	for _, name := range order {
		w := todo[name]
		if inst := s.services[name]; inst != nil {
			inst.endpoints = w.LocalEndpoints
			continue
		}
		if other, taken := s.owner[w.Port]; taken {
			s.fail(name, w, fmt.Errorf("port %d is already the health check node port of Service %s", w.Port, other))
			continue
		}
		inst := &instance{port: w.Port, endpoints: w.LocalEndpoints}
		if err := s.open(name, inst); err != nil {
			s.fail(name, w, err)
			continue
		}
		if _, retried := s.failed[name]; retried {
			s.log.Info("Health check node port now served", "service", name.String(), "port", w.Port)
			delete(s.failed, name)
		}
		s.log.V(2).Info("Opened health check node port", "service", name.String(), "port", w.Port)
		s.services[name] = inst
		s.owner[w.Port] = name
	}
}

// fail reports a port that cannot be served, once.
func (s *ServiceServers) fail(name types.NamespacedName, w ServiceHealth, err error) {
	port := w.Port
	if f, reported := s.failed[name]; reported && f.Port == port {
		s.failed[name] = w
		s.log.V(4).Info("Health check node port still unavailable", "service", name.String(), "port", port, "err", err)
		return
	}
	s.failed[name] = w
	s.log.Error(err, "Cannot serve the health check node port; load balancers will see this node as unhealthy for the Service", "service", name.String(), "port", port)
	if s.opts.Report != nil {
		s.opts.Report(name, ReasonFailedToStart, fmt.Sprintf("cannot serve health check node port %d: %v", port, err))
	}
}

// open starts one server per listen address; on error it closes what it
// opened.
func (s *ServiceServers) open(name types.NamespacedName, inst *instance) error {
	type listenAddr struct{ network, addr string }
	addrs := []listenAddr{{"tcp", ":" + strconv.Itoa(int(inst.port))}}
	if len(s.opts.IPs) > 0 || s.explicit {
		addrs = addrs[:0]
		for _, ip := range s.opts.IPs {
			network := "tcp6"
			if ip.Is4() {
				network = "tcp4"
			}
			addrs = append(addrs, listenAddr{network, netip.AddrPortFrom(ip, uint16(inst.port)).String()})
		}
	}
	for _, la := range addrs {
		addr := la.addr
		l, err := s.opts.Listen(la.network, addr)
		if err != nil {
			inst.close()
			return fmt.Errorf("listening on %s: %w", addr, err)
		}
		srv := &http.Server{Handler: serviceHandler{name: name, s: s}, ReadHeaderTimeout: 10 * time.Second}
		inst.servers = append(inst.servers, srv)
		go func() {
			if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error(err, "Health check node port server stopped", "service", name.String(), "address", addr)
			}
		}()
	}
	return nil
}

func (inst *instance) close() {
	for _, srv := range inst.servers {
		_ = srv.Close() // closes the listener; Serve returns ErrServerClosed
	}
	inst.servers = nil
}

// Serving returns the port each Service is served on.
func (s *ServiceServers) Serving() map[types.NamespacedName]int32 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[types.NamespacedName]int32, len(s.services))
	for name, inst := range s.services {
		out[name] = inst.port
	}
	return out
}

// Close stops every server; later Updates do nothing.
func (s *ServiceServers) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, inst := range s.services {
		inst.close()
	}
	clear(s.services)
	clear(s.owner)
	s.closed = true
}

type serviceHandler struct {
	name types.NamespacedName
	s    *ServiceServers
}

// serviceBody is upstream's answer body.
type serviceBody struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

func (h serviceHandler) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	h.s.mu.RLock()
	inst := h.s.services[h.name]
	count := 0
	if inst != nil {
		count = inst.endpoints
	}
	h.s.mu.RUnlock()
	healthy := h.s.opts.Healthy == nil || h.s.opts.Healthy()

	var body serviceBody
	body.Service.Namespace, body.Service.Name = h.name.Namespace, h.name.Name
	body.LocalEndpoints, body.ServiceProxyHealthy = count, healthy
	data, err := json.Marshal(body)
	if err != nil {
		data = []byte("{}")
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set(WeightHeader, strconv.Itoa(count))
	if inst != nil && count > 0 && healthy {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write(data)
}
