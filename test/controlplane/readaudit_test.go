package controlplane

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

const auditSample = `{"auditID":"a1","stage":"ResponseStarted","requestReceivedTimestamp":"2026-11-30T16:02:19.872240Z","requestURI":"/api/v1/services?watch=true","verb":"watch","user":{"username":"system:serviceaccount:kube-system:kproxy"},"objectRef":{"resource":"services","apiVersion":"v1"},"responseStatus":{"code":200},"annotations":{"authorization.k8s.io/decision":"allow"}}
{"auditID":"a2","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/default/secrets/x","verb":"get","user":{"username":"system:serviceaccount:kube-system:kproxy"},"objectRef":{"resource":"secrets","namespace":"default","name":"x","apiVersion":"v1"},"responseStatus":{"code":403},"annotations":{"authorization.k8s.io/decision":"forbid"}}
{"auditID":"a3","stage":"ResponseComplete","requestURI":"/api/v1/nodes","verb":"create","user":{"username":"kproxy-test-admin"},"objectRef":{"resource":"nodes","apiVersion":"v1"},"responseStatus":{"code":201},"annotations":{"authorization.k8s.io/decision":"allow"}}

{"auditID":"a1","stage":"ResponseComplete","requestURI":"/api/v1/services?watch=true","verb":"watch","user":{"username":"system:serviceaccount:kube-system:kproxy"},"objectRef":{"resource":"services","apiVersion":"v1"},"responseStatus":{"code":200}}
{"auditID":"a4","stage":"ResponseComplete","requestURI":"/apis/events.k8s.io/v1/namespaces/default/events","verb":"create","user":{"username":"system:serviceaccount:kube-system:kproxy"},"objectRef":{"resource":"events","namespace":"default","apiGroup":"events.k8s.io","apiVersion":"v1"},"responseStatus":{"code":201},"annotations":{"authorization.k8s.io/decision":"allow"}}
{"auditID":"a5","stage":"ResponseCo`

func TestReadAudit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	if err := os.WriteFile(path, []byte(auditSample), 0o644); err != nil {
		t.Fatal(err)
	}
	reqs, err := ReadAudit(path, "system:serviceaccount:kube-system:kproxy")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range reqs {
		got = append(got, r.AuditID+" "+r.Call()+" "+r.Decision)
	}
	want := []string{
		"a1 watch core/services allow", // the later stage keeps the decision of the first
		"a2 get core/secrets forbid",
		"a4 create events.k8s.io/events allow",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("requests:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if want := time.Date(2026, 11, 30, 16, 2, 19, 872240000, time.UTC); !reqs[0].Received.Equal(want) {
		t.Errorf("Received = %v, want %v", reqs[0].Received, want)
	}
	if c := Calls(reqs); !reflect.DeepEqual(c, []string{"create events.k8s.io/events", "get core/secrets", "watch core/services"}) {
		t.Errorf("Calls = %v", c)
	}
	if s := reqs[1].String(); s != "system:serviceaccount:kube-system:kproxy get core/secrets ns=default name=x → 403 forbid" {
		t.Errorf("String = %q", s)
	}
	all, err := ReadAudit(path, "")
	if err != nil || len(all) != 4 {
		t.Errorf("every user: %d requests (%v), want 4", len(all), err)
	}
}

func TestReadAuditErrors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	if _, err := ReadAudit(path, ""); err == nil {
		t.Error("a missing log is not an error")
	}
	if err := os.WriteFile(path, []byte("not json\n"+strings.SplitN(auditSample, "\n", 2)[0]+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	reqs, err := ReadAudit(path, "")
	if err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("err = %v, want one naming line 1", err)
	}
	if len(reqs) != 1 {
		t.Errorf("%d requests read past the bad line, want 1", len(reqs))
	}
	if c := (Request{Verb: "get", RequestURI: "/version"}).Call(); c != "get /version" {
		t.Errorf("non-resource Call = %q", c)
	}
}
