package hns

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
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
	// ClassTransient: HNS is not running, restarting or unreachable (the
	// "service not available" codes: RPC failures, 0x6b5, module not found,
	// a call that did not return in time). Retry the whole sync later with
	// backoff; never forget what was programmed.
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
// HRESULT_FROM_WIN32 wrapping, so Win32 errors usually arrive as plain Win32
// codes; ClassifyCode unwraps one that did not (0x8007xxxx) all the same.
const (
	CodeFileNotFound         uint32 = 0x2        // ERROR_FILE_NOT_FOUND
	CodeModNotFound          uint32 = 0x7e       // ERROR_MOD_NOT_FOUND: computenetwork.dll missing
	CodeAlreadyExists        uint32 = 0xb7       // ERROR_ALREADY_EXISTS
	CodeServiceDoesNotExist  uint32 = 0x424      // ERROR_SERVICE_DOES_NOT_EXIST: the hns service is not installed (yet)
	CodeServiceNotActive     uint32 = 0x426      // ERROR_SERVICE_NOT_ACTIVE
	CodeNotFound             uint32 = 0x490      // ERROR_NOT_FOUND ("Element not found")
	CodeShutdownInProgress   uint32 = 0x45b      // ERROR_SHUTDOWN_IN_PROGRESS
	CodeRPCUnknownInterface  uint32 = 0x6b5      // RPC_S_UNKNOWN_IF: HNS's RPC interface is not registered, HNS is not running (the code upstream checks)
	CodeRPCServerUnavailable uint32 = 0x6ba      // RPC_S_SERVER_UNAVAILABLE
	CodeRPCServerTooBusy     uint32 = 0x6bb      // RPC_S_SERVER_TOO_BUSY
	CodeRPCCallFailed        uint32 = 0x6be      // RPC_S_CALL_FAILED
	CodeRPCCallFailedDNE     uint32 = 0x6bf      // RPC_S_CALL_FAILED_DNE
	CodeRPCNoEndpoints       uint32 = 0x6d9      // EPT_S_NOT_REGISTERED: no RPC endpoint registered (HNS starting)
	CodeNotImplemented       uint32 = 0x80004001 // E_NOTIMPL
	CodeInvalidArg           uint32 = 0x80070057 // E_INVALIDARG
	CodeRPCDisconnected      uint32 = 0x80010108 // RPC_E_DISCONNECTED
	CodeRPCServerDied        uint32 = 0x80010007 // RPC_E_SERVER_DIED
	CodeRPCServerDiedDNE     uint32 = 0x80010012 // RPC_E_SERVER_DIED_DNE
	CodeNetworkNotFound      uint32 = 0x803b0001 // HCN_E_NETWORK_NOT_FOUND
	CodeEndpointNotFound     uint32 = 0x803b0002 // HCN_E_ENDPOINT_NOT_FOUND
	CodePolicyNotFound       uint32 = 0x803b0008 // HCN_E_POLICY_NOT_FOUND
	CodePolicyAlreadyExists  uint32 = 0x803b0012 // HCN_E_POLICY_ALREADY_EXISTS
	CodePortAlreadyExists    uint32 = 0x803b0013 // HCN_E_PORT_ALREADY_EXISTS: also a host socket holding the port
	CodeRequestUnsupported   uint32 = 0x803b0015 // HCN_E_REQUEST_UNSUPPORTED
	CodeManagerStopped       uint32 = 0x803b0020 // HCN_E_MANAGER_STOPPED: HNS is restarting
	CodeEntityHasReferences  uint32 = 0x803b002c // HCN_E_ENTITY_HAS_REFERENCES
	CodeEndpointSharingDeny  uint32 = 0x803b001d // HCN_E_ENDPOINT_SHARING_DISABLED
)

// ClassifyCode maps an HNS error code to its class. A Win32 code wrapped
// in an HRESULT (facility 7, 0x8007xxxx) is classified as the Win32 code.
func ClassifyCode(code uint32) Class {
	if code&0xffff0000 == 0x80070000 && code != CodeInvalidArg {
		code &= 0xffff
	}
	switch code {
	case CodeNotFound, CodeFileNotFound, CodeNetworkNotFound, CodeEndpointNotFound, CodePolicyNotFound:
		return ClassNotFound
	case CodeAlreadyExists, CodePortAlreadyExists, CodePolicyAlreadyExists:
		return ClassAlreadyExists
	case CodeModNotFound, CodeServiceDoesNotExist, CodeServiceNotActive, CodeShutdownInProgress,
		CodeRPCUnknownInterface, CodeRPCServerUnavailable, CodeRPCServerTooBusy, CodeRPCCallFailed,
		CodeRPCCallFailedDNE, CodeRPCNoEndpoints, CodeRPCDisconnected, CodeRPCServerDied, CodeRPCServerDiedDNE,
		CodeManagerStopped, CodeTimeout:
		return ClassTransient
	case CodeNotImplemented, CodeRequestUnsupported:
		return ClassNotImplemented
	case CodeEntityHasReferences, CodeEndpointSharingDeny:
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

// codeRE finds the code hcsshim prints at the end of an HNS error message:
// "hcnCreateLoadBalancer failed in Win32: The specified port already
// exists. (0x803b0013)".
var codeRE = regexp.MustCompile(`\(0x([0-9a-fA-F]{1,8})\)`)

// codeInMessage returns the last code printed in msg (0 when none): an
// error whose code is only in its text (upstream checks "0x6b5" so).
func codeInMessage(msg string) uint32 {
	m := codeRE.FindAllStringSubmatch(msg, -1)
	if len(m) == 0 {
		return 0
	}
	v, err := strconv.ParseUint(m[len(m)-1][1], 16, 32)
	if err != nil {
		return 0
	}
	return uint32(v)
}
