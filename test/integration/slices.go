package integration

import (
	"context"
	"errors"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/kproxy/kproxy/test/proxytest"
)

// ControllerName is the endpointslice.kubernetes.io/managed-by value of the
// EndpointSlice controller (kube-controller-manager).
const ControllerName = "endpointslice-controller.k8s.io"

// AsController makes slices look as the EndpointSlice controller writes them
// for svc: the managed-by label, the Service name label, the Service as
// controlling owner (svc must have its UID, i.e. come from the API server),
// and the endpoints.kubernetes.io/last-change-trigger-time annotation set to
// trigger (RFC 3339 with nanoseconds, as the controller formats it). The
// slices are changed in place.
func AsController(svc *v1.Service, trigger time.Time, slices ...*discovery.EndpointSlice) {
	ref := metav1.NewControllerRef(svc, v1.SchemeGroupVersion.WithKind("Service"))
	for _, s := range slices {
		if s.Labels == nil {
			s.Labels = map[string]string{}
		}
		s.Labels[discovery.LabelServiceName] = svc.Name
		s.Labels[discovery.LabelManagedBy] = ControllerName
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[v1.EndpointsLastChangeTriggerTime] = trigger.UTC().Format(time.RFC3339Nano)
		s.OwnerReferences = []metav1.OwnerReference{*ref}
		s.Namespace = svc.Namespace
	}
}

// Writer plays the EndpointSlice controller (and, for LoadBalancer
// Services, the cloud controller that fills in the ingress) against an API
// server, for Services built by proxytest.
type Writer struct {
	Client   kubernetes.Interface
	Topology *proxytest.Topology
	// Now is the clock of trigger times (default time.Now).
	Now func() time.Time
}

func (w *Writer) now() time.Time {
	if w.Now != nil {
		return w.Now()
	}
	return time.Now()
}

// CreateService creates svc, then writes its load-balancer status when it
// has one (the API server drops status on create), and returns the stored
// Service.
func (w *Writer) CreateService(ctx context.Context, svc *v1.Service) (*v1.Service, error) {
	out, err := w.Client.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating Service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	if len(svc.Status.LoadBalancer.Ingress) == 0 {
		return out, nil
	}
	out.Status = *svc.Status.DeepCopy()
	out, err = w.Client.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, out, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("writing the load-balancer status of Service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	return out, nil
}

// SetEndpoints writes svc's EndpointSlices listing eps (proxytest.Slices:
// one slice per IP family), creating or updating each, stamped with a
// trigger time taken just before the first write. svc must come from the
// API server. It returns the trigger time.
func (w *Writer) SetEndpoints(ctx context.Context, svc *v1.Service, eps ...proxytest.EP) (time.Time, error) {
	slices, err := w.Topology.Slices(svc, eps...)
	if err != nil {
		return time.Time{}, err
	}
	trigger := w.now()
	AsController(svc, trigger, slices...)
	return trigger, w.ApplySlices(ctx, slices...)
}

// ApplySlices creates each slice, or replaces the stored one of that name.
func (w *Writer) ApplySlices(ctx context.Context, slices ...*discovery.EndpointSlice) error {
	for _, s := range slices {
		c := w.Client.DiscoveryV1().EndpointSlices(s.Namespace)
		_, err := c.Create(ctx, s, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			var cur *discovery.EndpointSlice
			if cur, err = c.Get(ctx, s.Name, metav1.GetOptions{}); err == nil {
				upd := s.DeepCopy()
				upd.ResourceVersion = cur.ResourceVersion
				_, err = c.Update(ctx, upd, metav1.UpdateOptions{})
			}
		}
		if err != nil {
			return fmt.Errorf("writing EndpointSlice %s/%s: %w", s.Namespace, s.Name, err)
		}
	}
	return nil
}

// DeleteService deletes svc's EndpointSlices, then svc: the test cluster
// runs no garbage collector to follow the owner references.
func (w *Writer) DeleteService(ctx context.Context, svc *v1.Service) error {
	sel := labels.SelectorFromSet(labels.Set{discovery.LabelServiceName: svc.Name}).String()
	list, err := w.Client.DiscoveryV1().EndpointSlices(svc.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return fmt.Errorf("listing the EndpointSlices of %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	var errs []error
	for _, s := range list.Items {
		if err := w.Client.DiscoveryV1().EndpointSlices(s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting EndpointSlice %s/%s: %w", s.Namespace, s.Name, err))
		}
	}
	if err := w.Client.CoreV1().Services(svc.Namespace).Delete(ctx, svc.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("deleting Service %s/%s: %w", svc.Namespace, svc.Name, err))
	}
	return errors.Join(errs...)
}
