package gateway

import (
	"flag"
	"io/fs"
	"os"
	"testing"

	"sigs.k8s.io/gateway-api/conformance"
)

// TestConformance runs the upstream Gateway API conformance suite, unmodified, against the
// cluster that -kubeconfig (or KUBECONFIG) names, with the upstream flags
// (sigs.k8s.io/gateway-api/conformance/utils/flags) and duet's defaults for those not given
// (options.go). DUET_ECHO_IMAGE renames the echo server image in the suite's manifests.
// It needs a cluster with the standard CRDs (go run ./cmd/crds apply) and duet running: run.sh.
func TestConformance(t *testing.T) {
	if os.Getenv("DUET_GATEWAY_CONFORMANCE") != "1" {
		t.Skip("needs a cluster running duet: run conformance/gateway/run.sh KUBECONFIG REPORT_DIR")
	}
	opts := conformance.DefaultOptions(t)
	ApplyDefaults(&opts, explicitFlags(), os.Getenv)
	manifests, err := WithEchoImage(&conformance.Manifests, os.Getenv("DUET_ECHO_IMAGE"))
	if err != nil {
		t.Fatalf("rewriting the echo image in the suite's manifests: %v", err)
	}
	opts.ManifestFS = []fs.FS{manifests}
	conformance.RunConformanceWithOptions(t, opts)
}

// explicitFlags names the flags given on the command line.
func explicitFlags() map[string]bool {
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}
