package main

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/gateway-api/pkg/client/clientset/versioned/fake"
)

func TestGatewayClassIsCreatedOnceAndNeverTakenOver(t *testing.T) {
	ctx := context.Background()
	api := fake.NewSimpleClientset().GatewayV1().GatewayClasses()
	for range 2 { // the second run finds it and leaves it
		if err := ensureGatewayClass(ctx, api, "duet", "duet.dev/gateway-controller"); err != nil {
			t.Fatal(err)
		}
	}
	class, err := api.Get(ctx, "duet", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if class.Spec.ControllerName != "duet.dev/gateway-controller" {
		t.Errorf("controllerName %q", class.Spec.ControllerName)
	}

	other := &gatewayv1.GatewayClass{
		ObjectMeta: metav1.ObjectMeta{Name: "theirs"},
		Spec:       gatewayv1.GatewayClassSpec{ControllerName: "example.com/other"},
	}
	if _, err := api.Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = ensureGatewayClass(ctx, api, "theirs", "duet.dev/gateway-controller")
	if err == nil || !strings.Contains(err.Error(), `"example.com/other"`) {
		t.Fatalf("err = %v, want a refusal naming the other controller", err)
	}
	still, _ := api.Get(ctx, "theirs", metav1.GetOptions{})
	if still.Spec.ControllerName != "example.com/other" {
		t.Error("another controller's GatewayClass was changed")
	}
}
