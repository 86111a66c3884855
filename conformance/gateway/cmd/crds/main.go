// Command crds prints or installs the Gateway API CRDs of a release channel (-channel standard,
// the default, or experimental) of the
// sigs.k8s.io/gateway-api version this module pins (go.mod), so a test cluster carries exactly
// the bundle version the conformance suite checks for.
//
//	go run ./cmd/crds print                      # the CRDs as one multi-document YAML stream
//	go run ./cmd/crds apply -kubeconfig PATH     # create or update them, wait until Established
//	go run ./cmd/crds gatewayclass -kubeconfig PATH [-name duet] [-controller-name duet.dev/gateway-controller]
//
// gatewayclass creates the GatewayClass the suite runs against (it must exist beforehand) unless
// it exists; one of another controller is refused.
//
// The CRDs are read from the module's directory in the Go module cache (go mod download).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"duet.dev/conformance/gateway"
	gwclientset "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "crds:", err)
		os.Exit(1)
	}
}

func usage() error {
	fmt.Fprintln(os.Stderr, "usage: crds print [-dir DIR] [-channel standard|experimental] | crds apply -kubeconfig PATH [-dir DIR] [-channel C] [-timeout 60s]"+
		" | crds gatewayclass -kubeconfig PATH [-name duet] [-controller-name duet.dev/gateway-controller]")
	os.Exit(64)
	return nil
}

func run(args []string) error {
	if len(args) == 0 || (args[0] != "print" && args[0] != "apply" && args[0] != "gatewayclass") {
		return usage()
	}
	fl := flag.NewFlagSet(args[0], flag.ContinueOnError)
	dir := fl.String("dir", "", "the sigs.k8s.io/gateway-api module directory (default: from go mod download)")
	kubeconfig := fl.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the cluster (apply)")
	channel := fl.String("channel", "standard", "the CRDs' release channel: standard or experimental")
	timeout := fl.Duration("timeout", 60*time.Second, "how long apply waits for the CRDs to be Established")
	name := fl.String("name", gateway.GatewayClassName, "gatewayclass: the GatewayClass name")
	controller := fl.String("controller-name", gateway.ControllerName, "gatewayclass: its spec.controllerName")
	if err := fl.Parse(args[1:]); err != nil {
		os.Exit(64)
	}
	if args[0] == "gatewayclass" {
		return gatewayClassOnCluster(*kubeconfig, *name, *controller, *timeout)
	}
	crds, err := loadPinned(*dir, *channel)
	if err != nil {
		return err
	}
	if args[0] == "print" {
		return printCRDs(os.Stdout, crds)
	}
	return applyToCluster(*kubeconfig, crds, *timeout)
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		return nil, fmt.Errorf("needs -kubeconfig or KUBECONFIG")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", kubeconfig, err)
	}
	return cfg, nil
}

func gatewayClassOnCluster(kubeconfig, name, controller string, timeout time.Duration) error {
	cfg, err := restConfig(kubeconfig)
	if err != nil {
		return err
	}
	client, err := gwclientset.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return ensureGatewayClass(ctx, client.GatewayV1().GatewayClasses(), name, controller)
}

func applyToCluster(kubeconfig string, crds []CRD, timeout time.Duration) error {
	cfg, err := restConfig(kubeconfig)
	if err != nil {
		return err
	}
	client, err := clientset.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	api := client.ApiextensionsV1().CustomResourceDefinitions()
	if err := apply(ctx, api, crds); err != nil {
		return err
	}
	return waitEstablished(ctx, api, crds, 200*time.Millisecond)
}
