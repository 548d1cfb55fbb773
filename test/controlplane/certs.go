package controlplane

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"time"
)

// pki is the key material of one control plane, all PEM encoded.
type pki struct {
	caCert      []byte // CA certificate: clients trust it; also --client-ca-file
	servingCert []byte // kube-apiserver serving certificate, signed by the CA
	servingKey  []byte
	saKey       []byte // service-account token signing key (private)
	saPub       []byte // its public key, for token verification
	// kubeletClientCert is kube-apiserver's client certificate towards
	// kubelets (logs, exec, port-forward): user kube-apiserver-kubelet-client
	// in system:masters, signed by the CA (a kubelet's clientCAFile).
	kubeletClientCert []byte
	kubeletClientKey  []byte
}

// certValidity is how long the generated certificates are valid. Test control
// planes live minutes; a day leaves room for a debugging session.
const certValidity = 24 * time.Hour

// newPKI makes a CA and a serving certificate for listenIP (plus loopback,
// "localhost" and the in-cluster names of the kubernetes Service, and
// firstServiceIP when valid), and a service-account signing key pair.
func newPKI(listenIP, firstServiceIP netip.Addr, now time.Time) (*pki, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	notBefore, notAfter := now.Add(-time.Hour), now.Add(certValidity)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kproxy-test-ca"},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("creating CA certificate: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("parsing CA certificate: %w", err)
	}

	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating serving key: %w", err)
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{
			"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local",
		},
		IPAddresses: servingIPs(listenIP, firstServiceIP),
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("creating serving certificate: %w", err)
	}
	srvKeyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		return nil, fmt.Errorf("encoding serving key: %w", err)
	}

	kcKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating kubelet client key: %w", err)
	}
	kcTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(3),
		Subject:      pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	kcDER, err := x509.CreateCertificate(rand.Reader, kcTmpl, caCert, &kcKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("creating kubelet client certificate: %w", err)
	}
	kcKeyDER, err := x509.MarshalECPrivateKey(kcKey)
	if err != nil {
		return nil, fmt.Errorf("encoding kubelet client key: %w", err)
	}

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating service-account key: %w", err)
	}
	saKeyDER, err := x509.MarshalECPrivateKey(saKey)
	if err != nil {
		return nil, fmt.Errorf("encoding service-account key: %w", err)
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("encoding service-account public key: %w", err)
	}

	return &pki{
		caCert:      pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		servingCert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER}),
		servingKey:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: srvKeyDER}),
		saKey:       pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: saKeyDER}),
		saPub:       pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPubDER}),

		kubeletClientCert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: kcDER}),
		kubeletClientKey:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kcKeyDER}),
	}, nil
}

// servingIPs lists the IP SANs: the listen IP first, then loopback and the
// kubernetes Service IP, without duplicates or invalid addresses.
func servingIPs(listenIP, firstServiceIP netip.Addr) []net.IP {
	var out []net.IP
	seen := map[netip.Addr]bool{}
	for _, a := range []netip.Addr{listenIP, netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback(), firstServiceIP} {
		if !a.IsValid() || seen[a.Unmap()] {
			continue
		}
		seen[a.Unmap()] = true
		out = append(out, net.IP(a.Unmap().AsSlice()))
	}
	return out
}
