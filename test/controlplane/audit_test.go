package controlplane

import (
	"strings"
	"testing"
)

const (
	auditAllowed       = `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a1","stage":"ResponseComplete","requestURI":"/api/v1/services","verb":"list","user":{"username":"system:serviceaccount:kube-system:kproxy"},"objectRef":{"resource":"services","apiVersion":"v1"},"responseStatus":{"code":200},"annotations":{"authorization.k8s.io/decision":"allow","authorization.k8s.io/reason":"RBAC: allowed by ClusterRoleBinding"}}`
	auditDenied        = `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"d1","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/kube-system/secrets/x","verb":"get","user":{"username":"system:serviceaccount:kube-system:kproxy"},"objectRef":{"resource":"secrets","namespace":"kube-system","name":"x","apiVersion":"v1"},"responseStatus":{"code":403},"annotations":{"authorization.k8s.io/decision":"forbid","authorization.k8s.io/reason":""}}`
	auditDeniedStarted = `{"auditID":"d1","stage":"ResponseStarted","verb":"get","user":{"username":"system:serviceaccount:kube-system:kproxy"},"annotations":{"authorization.k8s.io/decision":"forbid"}}`
	auditDeniedGroup   = `{"auditID":"d2","stage":"ResponseComplete","requestURI":"/apis/discovery.k8s.io/v1/endpointslices?watch=true","verb":"watch","user":{"username":"bob"},"objectRef":{"resource":"endpointslices","apiGroup":"discovery.k8s.io"},"responseStatus":{"code":403},"annotations":{"authorization.k8s.io/decision":"forbid","authorization.k8s.io/reason":"no rule"}}`
	auditDeniedURL     = `{"auditID":"d3","stage":"ResponseComplete","requestURI":"/metrics","verb":"get","user":{"username":"bob"},"responseStatus":{"code":403},"annotations":{"authorization.k8s.io/decision":"forbid"}}`
)

func TestParseDenials(t *testing.T) {
	tests := []struct {
		name    string
		log     string
		want    []string // Denial.String() of each
		wantErr string
	}{
		{name: "empty", log: ""},
		{name: "allowed requests only", log: auditAllowed + "\n" + auditAllowed + "\n"},
		{
			name: "denials in order, one per request",
			log:  auditAllowed + "\n" + auditDeniedStarted + "\n" + auditDenied + "\n" + auditDeniedGroup + "\n" + auditDeniedURL + "\n",
			want: []string{
				"system:serviceaccount:kube-system:kproxy get secrets kube-system/x (403)",
				"bob watch endpointslices.discovery.k8s.io (403): no rule",
				"bob get /metrics (403)",
			},
		},
		{
			name: "partial last line is still being written",
			log:  auditDenied + "\n" + auditDeniedGroup[:40],
			want: []string{"system:serviceaccount:kube-system:kproxy get secrets kube-system/x (403)"},
		},
		{
			name:    "a broken line is reported after what could be read",
			log:     "not json\n" + auditDenied + "\n",
			want:    []string{"system:serviceaccount:kube-system:kproxy get secrets kube-system/x (403)"},
			wantErr: "line 1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseDenials(strings.NewReader(tt.log))
			if tt.wantErr == "" && err != nil {
				t.Fatalf("parseDenials: %v", err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("parseDenials error = %v, want one mentioning %q", err, tt.wantErr)
			}
			var gotS []string
			for _, d := range got {
				gotS = append(gotS, d.String())
			}
			if strings.Join(gotS, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("denials:\n%s\nwant:\n%s", strings.Join(gotS, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}
