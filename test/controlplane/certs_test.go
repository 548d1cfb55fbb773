package controlplane

import (
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/pem"
	"net/netip"
	"slices"
	"testing"
	"time"
)

func decodeCert(t *testing.T, pemData []byte) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode(pemData)
	if b == nil || b.Type != "CERTIFICATE" {
		t.Fatalf("not a PEM certificate: %q", pemData)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNewPKI(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name      string
		listen    netip.Addr
		serviceIP netip.Addr
		wantIPs   []string
	}{
		{"IPv4 node address", netip.MustParseAddr("10.250.0.10"), netip.MustParseAddr("10.96.0.1"),
			[]string{"10.250.0.10", "127.0.0.1", "::1", "10.96.0.1"}},
		{"IPv6 node address", netip.MustParseAddr("fd00::10"), netip.MustParseAddr("fd00:96::1"),
			[]string{"fd00::10", "127.0.0.1", "::1", "fd00:96::1"}},
		{"loopback listen is not repeated", netip.MustParseAddr("127.0.0.1"), netip.Addr{},
			[]string{"127.0.0.1", "::1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := newPKI(tt.listen, tt.serviceIP, now)
			if err != nil {
				t.Fatal(err)
			}
			ca, srv := decodeCert(t, p.caCert), decodeCert(t, p.servingCert)
			if !ca.IsCA {
				t.Error("CA certificate is not a CA")
			}
			var got []string
			for _, ip := range srv.IPAddresses {
				a, _ := netip.AddrFromSlice(ip)
				got = append(got, a.Unmap().String())
			}
			if !slices.Equal(got, tt.wantIPs) {
				t.Errorf("serving IP SANs = %v, want %v", got, tt.wantIPs)
			}

			// What a client does: verify the serving certificate for the
			// listen IP against the CA, at a time inside the validity.
			pool := x509.NewCertPool()
			pool.AddCert(ca)
			if _, err := srv.Verify(x509.VerifyOptions{
				DNSName: tt.listen.String(), Roots: pool, CurrentTime: now,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			}); err != nil {
				t.Errorf("serving certificate does not verify for %s: %v", tt.listen, err)
			}
			if _, err := srv.Verify(x509.VerifyOptions{DNSName: "kubernetes.default.svc", Roots: pool, CurrentTime: now}); err != nil {
				t.Errorf("serving certificate does not verify for the in-cluster name: %v", err)
			}
			if _, err := srv.Verify(x509.VerifyOptions{DNSName: "10.1.2.3", Roots: pool, CurrentTime: now}); err == nil {
				t.Error("serving certificate verifies for an address it was not made for")
			}

			// The service-account keys are a pair.
			kb, _ := pem.Decode(p.saKey)
			pb, _ := pem.Decode(p.saPub)
			if kb == nil || pb == nil {
				t.Fatal("service-account keys are not PEM")
			}
			key, err := x509.ParseECPrivateKey(kb.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			pub, err := x509.ParsePKIXPublicKey(pb.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			if !key.PublicKey.Equal(pub.(*ecdsa.PublicKey)) {
				t.Error("service-account public key does not match the signing key")
			}
			kb, _ = pem.Decode(p.servingKey)
			if kb == nil {
				t.Fatal("serving key is not PEM")
			}
			if sk, err := x509.ParseECPrivateKey(kb.Bytes); err != nil || !sk.PublicKey.Equal(srv.PublicKey) {
				t.Errorf("serving key does not match the serving certificate (err %v)", err)
			}

			// kube-apiserver's client certificate towards kubelets: a
			// system:masters client that a kubelet trusting the CA accepts.
			kc := decodeCert(t, p.kubeletClientCert)
			if _, err := kc.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
				t.Errorf("kubelet client certificate does not verify as a client: %v", err)
			}
			if kc.Subject.CommonName != "kube-apiserver-kubelet-client" || !slices.Equal(kc.Subject.Organization, []string{"system:masters"}) {
				t.Errorf("kubelet client certificate subject = %v", kc.Subject)
			}
			kb, _ = pem.Decode(p.kubeletClientKey)
			if kb == nil {
				t.Fatal("kubelet client key is not PEM")
			}
			if ck, err := x509.ParseECPrivateKey(kb.Bytes); err != nil || !ck.PublicKey.Equal(kc.PublicKey) {
				t.Errorf("kubelet client key does not match its certificate (err %v)", err)
			}
		})
	}
}
