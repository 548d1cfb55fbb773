package hns

import (
	"errors"
	"fmt"
	"testing"
)

func TestClassifyCode(t *testing.T) {
	for _, tc := range []struct {
		code uint32
		want Class
	}{
		{CodeNotFound, ClassNotFound},
		{CodeNetworkNotFound, ClassNotFound},
		{CodeEndpointNotFound, ClassNotFound},
		{CodePolicyNotFound, ClassNotFound},
		{CodePortAlreadyExists, ClassAlreadyExists},
		{CodeAlreadyExists, ClassAlreadyExists},
		{CodeModNotFound, ClassTransient},
		{CodeRPCServerUnavailable, ClassTransient},
		{CodeRPCCallFailed, ClassTransient},
		{CodeManagerStopped, ClassTransient},
		{CodeNotImplemented, ClassNotImplemented},
		{CodeEntityHasReferences, ClassInUse},
		{CodeInvalidArg, ClassOther},
		{0, ClassOther},
	} {
		if got := ClassifyCode(tc.code); got != tc.want {
			t.Errorf("ClassifyCode(0x%x) = %s, want %s", tc.code, got, tc.want)
		}
	}
}

func TestErrorPredicates(t *testing.T) {
	inner := errors.New("boom")
	err := fmt.Errorf("creating load balancer: %w", NewError(OpCreateLoadBalancer, CodePortAlreadyExists, inner))
	if !IsAlreadyExists(err) || IsNotFound(err) || IsTransient(err) || IsNotImplemented(err) {
		t.Errorf("predicates wrong for %v", err)
	}
	if !errors.Is(err, inner) {
		t.Errorf("the HNS error does not unwrap")
	}
	if IsNotFound(nil) || IsTransient(errors.New("plain")) {
		t.Errorf("nil and plain errors have no class")
	}
	var e *Error
	if !errors.As(err, &e) || e.CodeString() != "0x803b0013" {
		t.Errorf("code string %q", e.CodeString())
	}
}

func TestClassifyServiceUnavailable(t *testing.T) {
	// The "service not available" codes, plain and as HRESULTs: HNS is not
	// running (0x6b5, the code upstream checks), restarting or unreachable.
	for _, code := range []uint32{CodeRPCUnknownInterface, 0x800706b5, CodeServiceNotActive, 0x80070426,
		CodeServiceDoesNotExist, CodeRPCServerUnavailable, 0x800706ba, CodeRPCServerTooBusy, CodeRPCNoEndpoints,
		CodeRPCServerDied, CodeShutdownInProgress} {
		if got := ClassifyCode(code); got != ClassTransient {
			t.Errorf("ClassifyCode(0x%x) = %s, want Transient", code, got)
		}
	}
	if got := ClassifyCode(0x80070002); got != ClassNotFound {
		t.Errorf("ClassifyCode(0x80070002) = %s, want NotFound", got)
	}
}

func TestCodeInMessage(t *testing.T) {
	for msg, want := range map[string]uint32{
		"hcnCreateLoadBalancer failed in Win32: The specified port already exists. (0x803b0013) {\"Success\":false}": CodePortAlreadyExists,
		"HNS error: (0x6b5)":    CodeRPCUnknownInterface,
		"no code here":          0,
		"(0x1) then (0x6ba)":    CodeRPCServerUnavailable,
		"(0x123456789) too big": 0,
	} {
		if got := codeInMessage(msg); got != want {
			t.Errorf("codeInMessage(%q) = 0x%x, want 0x%x", msg, got, want)
		}
	}
}
