package windows

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
