package main

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwtyped "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned/typed/apis/v1"
)

// ensureGatewayClass creates the cluster-scoped GatewayClass name for controller unless it
// exists; one that exists for another controller is refused rather than taken over.
func ensureGatewayClass(ctx context.Context, api gwtyped.GatewayClassInterface, name, controller string) error {
	have, err := api.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		class := &gatewayv1.GatewayClass{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       gatewayv1.GatewayClassSpec{ControllerName: gatewayv1.GatewayController(controller)},
		}
		if _, err := api.Create(ctx, class, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating GatewayClass %s: %w", name, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("reading GatewayClass %s: %w", name, err)
	case string(have.Spec.ControllerName) != controller:
		return fmt.Errorf("GatewayClass %s exists for controller %q, not %q", name, have.Spec.ControllerName, controller)
	}
	return nil
}
