package windows

import (
	"errors"
	"fmt"
)

// Class sorts HNS errors by what the caller should do about them.
type Class int

// Error classes.
const (
	// ClassOther is every error not listed below: the operation failed for
	// this object; other objects are unaffected.
	ClassOther Class = iota
	// ClassNotFound: the object (or what it refers to) does not exist.
	// Deleting something already gone is success.
	ClassNotFound
	// ClassAlreadyExists: a conflicting object exists; re-list and adopt.
	ClassAlreadyExists
	// ClassTransient: HNS is restarting or unreachable (RPC failures, module
	// not found, a call that did not return within Options.CallTimeout). Retry the whole sync later with backoff; never forget what
	// was programmed.
	ClassTransient
	// ClassNotImplemented: this HNS version lacks the operation.
	ClassNotImplemented
	// ClassInUse: the object is still referenced by another object.
	ClassInUse
)

func (c Class) String() string {
	switch c {
	case ClassNotFound:
		return "NotFound"
	case ClassAlreadyExists:
		return "AlreadyExists"
	case ClassTransient:
		return "Transient"
	case ClassNotImplemented:
		return "NotImplemented"
	case ClassInUse:
		return "InUse"
	}
	return "Other"
}

// Win32 and HRESULT codes HNS returns that kproxy tells apart. hcsshim strips
// HRESULT_FROM_WIN32 wrapping, so Win32 errors arrive as plain Win32 codes.
const (
	CodeFileNotFound          uint32 = 0x2        // ERROR_FILE_NOT_FOUND
	CodeModNotFound           uint32 = 0x7e       // ERROR_MOD_NOT_FOUND: computenetwork.dll missing
	CodeAlreadyExists         uint32 = 0xb7       // ERROR_ALREADY_EXISTS
	CodeServiceNotActive      uint32 = 0x426      // ERROR_SERVICE_NOT_ACTIVE
	CodeNotFound              uint32 = 0x490      // ERROR_NOT_FOUND ("Element not found")
	CodeRPCServerUnavailable  uint32 = 0x6ba      // RPC_S_SERVER_UNAVAILABLE
	CodeRPCCallFailed         uint32 = 0x6be      // RPC_S_CALL_FAILED
	CodeRPCCallFailedDNE      uint32 = 0x6bf      // RPC_S_CALL_FAILED_DNE
	CodeNotImplemented        uint32 = 0x80004001 // E_NOTIMPL
	CodeInvalidArg            uint32 = 0x80070057 // E_INVALIDARG
	CodeRPCDisconnected       uint32 = 0x80010108 // RPC_E_DISCONNECTED
	CodeNetworkNotFound       uint32 = 0x803b0001 // HCN_E_NETWORK_NOT_FOUND
	CodeEndpointNotFound      uint32 = 0x803b0002 // HCN_E_ENDPOINT_NOT_FOUND
	CodePolicyNotFound        uint32 = 0x803b0008 // HCN_E_POLICY_NOT_FOUND
	CodePolicyAlreadyExists   uint32 = 0x803b0012 // HCN_E_POLICY_ALREADY_EXISTS
	CodePortAlreadyExists     uint32 = 0x803b0013 // HCN_E_PORT_ALREADY_EXISTS
	CodeRequestUnsupported    uint32 = 0x803b0015 // HCN_E_REQUEST_UNSUPPORTED
	CodeManagerStopped        uint32 = 0x803b0020 // HCN_E_MANAGER_STOPPED: HNS is restarting
	CodeEntityHasReferences   uint32 = 0x803b002c // HCN_E_ENTITY_HAS_REFERENCES
	codeEndpointSharingDenied uint32 = 0x803b001d // HCN_E_ENDPOINT_SHARING_DISABLED
)

// ClassifyCode maps an HNS error code to its class.
func ClassifyCode(code uint32) Class {
	switch code {
	case CodeNotFound, CodeFileNotFound, CodeNetworkNotFound, CodeEndpointNotFound, CodePolicyNotFound:
		return ClassNotFound
	case CodeAlreadyExists, CodePortAlreadyExists, CodePolicyAlreadyExists:
		return ClassAlreadyExists
	case CodeModNotFound, CodeServiceNotActive, CodeRPCServerUnavailable, CodeRPCCallFailed,
		CodeRPCCallFailedDNE, CodeRPCDisconnected, CodeManagerStopped, CodeTimeout:
		return ClassTransient
	case CodeNotImplemented, CodeRequestUnsupported:
		return ClassNotImplemented
	case CodeEntityHasReferences, codeEndpointSharingDenied:
		return ClassInUse
	}
	return ClassOther
}

// Error is an HNS call failure: the operation, HNS's code and its class.
type Error struct {
	// Op names the HNS operation ("CreateLoadBalancer", ...).
	Op string
	// Code is the Win32 or HRESULT code (0 when HNS gave none).
	Code  uint32
	Class Class
	Err   error
}

// NewError classifies err by code and wraps it.
func NewError(op string, code uint32, err error) *Error {
	return &Error{Op: op, Code: code, Class: ClassifyCode(code), Err: err}
}

func (e *Error) Error() string {
	return fmt.Sprintf("hns %s: %v (code 0x%x, %s)", e.Op, e.Err, e.Code, e.Class)
}

func (e *Error) Unwrap() error { return e.Err }

// CodeString renders the code for metrics labels ("0x803b0013").
func (e *Error) CodeString() string { return fmt.Sprintf("0x%x", e.Code) }

// ClassOf returns the class of err (ClassOther when err is not an *Error).
func ClassOf(err error) Class {
	var e *Error
	if errors.As(err, &e) {
		return e.Class
	}
	return ClassOther
}

// IsNotFound reports whether err says an HNS object does not exist.
func IsNotFound(err error) bool { return err != nil && ClassOf(err) == ClassNotFound }

// IsAlreadyExists reports whether err says a conflicting HNS object exists.
func IsAlreadyExists(err error) bool { return err != nil && ClassOf(err) == ClassAlreadyExists }

// IsTransient reports whether err says HNS is unavailable for now.
func IsTransient(err error) bool { return err != nil && ClassOf(err) == ClassTransient }

// IsNotImplemented reports whether err says this HNS lacks the operation.
func IsNotImplemented(err error) bool { return err != nil && ClassOf(err) == ClassNotImplemented }

// ErrUnsupportedPlatform is returned by NewHNS on operating systems other
// than Windows. Dry runs work everywhere; programming needs Windows.
var ErrUnsupportedPlatform = errors.New("HNS is only available on Windows")
