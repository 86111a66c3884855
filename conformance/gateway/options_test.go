package gateway

import (
	"io/fs"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/gateway-api/conformance"
	"sigs.k8s.io/gateway-api/conformance/utils/flags"
	"sigs.k8s.io/gateway-api/conformance/utils/suite"
	"sigs.k8s.io/gateway-api/pkg/features"
)

func env(values map[string]string) Env {
	return func(k string) string { return values[k] }
}

// upstreamDefaults is what conformance.DefaultOptions yields with no flags and no options file.
func upstreamDefaults() suite.ConformanceOptions {
	var opts suite.ConformanceOptions
	opts.GatewayClassName = flags.DefaultGatewayClassName
	opts.Mode = flags.DefaultMode
	return opts
}

// gatewayClassFeatures reads SUPPORTED_FEATURES of controller/src/gateway/class.rs, sorted.
func gatewayClassFeatures(t *testing.T) []features.FeatureName {
	t.Helper()
	src, err := os.ReadFile("../../controller/src/gateway/class.rs")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile(`(?s)SUPPORTED_FEATURES: &\[&str\] = &\[(.*?)\];`).FindSubmatch(src)
	if block == nil {
		t.Fatal("no SUPPORTED_FEATURES in class.rs")
	}
	var out []features.FeatureName
	for _, m := range regexp.MustCompile(`"([A-Za-z0-9]+)"`).FindAllSubmatch(block[1], -1) {
		out = append(out, features.FeatureName(m[1]))
	}
	slices.Sort(out)
	return out
}

// Experimental-channel features are claimed on the experimental channel's CRDs only.
func TestExperimentalFeaturesAreClaimedOnTheExperimentalChannelOnly(t *testing.T) {
	all := []features.FeatureName{"Gateway", "HTTPRoute", "HTTPRouteRetry", "HTTPRouteQueryParamMatching", "TLSRouteModeMixed"}
	// TLSRouteModeMixed is experimental but needs no field the standard CRDs lack.
	if got := ForChannel(all, "standard"); !slices.Equal(got, []features.FeatureName{"Gateway", "HTTPRoute", "HTTPRouteQueryParamMatching", "TLSRouteModeMixed"}) {
		t.Errorf("standard: %v", got)
	}
	if got := ForChannel(all, ""); slices.Contains(got, "HTTPRouteRetry") {
		t.Errorf("no channel named: %v", got)
	}
	if got := ForChannel(all, "experimental"); !slices.Equal(got, all) {
		t.Errorf("experimental: %v", got)
	}
}

func TestDefaultsNameDuetAndItsProfiles(t *testing.T) {
	opts := upstreamDefaults()
	ApplyDefaults(&opts, map[string]bool{}, env(map[string]string{"DUET_VERSION": "0.1.0", "DUET_GATEWAY_CHANNEL": "experimental"}))
	if opts.GatewayClassName != "duet" {
		t.Errorf("gateway class %q, want duet", opts.GatewayClassName)
	}
	wantProfiles := []suite.ConformanceProfileName{"GATEWAY-HTTP", "GATEWAY-GRPC", "GATEWAY-TLS"}
	if !slices.Equal(opts.ConformanceProfiles, wantProfiles) {
		t.Errorf("profiles %v, want %v", opts.ConformanceProfiles, wantProfiles)
	}
	// The features claimed to the suite are the ones the GatewayClass status lists, no more.
	wantFeatures := gatewayClassFeatures(t)
	got := slices.Clone(opts.SupportedFeatures)
	slices.Sort(got)
	if !slices.Equal(got, wantFeatures) {
		t.Errorf("features %v, want those of controller/src/gateway/class.rs %v", got, wantFeatures)
	}
	if len(got) < 4 || !slices.Contains(got, "HTTPRoute") {
		t.Errorf("features %v lack the core ones", got)
	}
	impl := opts.Implementation
	if impl.Organization != "duet-dev" || impl.Project != "duet" || impl.Version != "0.1.0" ||
		impl.URL != "https://github.com/duet-dev/duet" || len(impl.Contact) != 1 {
		t.Errorf("implementation %+v", impl)
	}
	// The upstream suite refuses to write a report for an incomplete implementation.
	if err := impl.Validate(); err != nil {
		t.Errorf("implementation does not validate: %v", err)
	}
}

func TestExplicitFlagsWin(t *testing.T) {
	opts := upstreamDefaults()
	opts.GatewayClassName = flags.DefaultGatewayClassName // -gateway-class=gateway-conformance
	opts.SupportedFeatures = nil                          // -supported-features=
	opts.ConformanceProfiles = []suite.ConformanceProfileName{"GATEWAY-HTTP"}
	opts.Implementation.Version = "v9"
	explicit := map[string]bool{"gateway-class": true, "supported-features": true, "version": true}
	ApplyDefaults(&opts, explicit, env(map[string]string{"DUET_VERSION": "0.1.0"}))
	if opts.GatewayClassName != flags.DefaultGatewayClassName {
		t.Errorf("an explicit -gateway-class was replaced by %q", opts.GatewayClassName)
	}
	if opts.SupportedFeatures != nil {
		t.Errorf("an explicit empty -supported-features was replaced by %v", opts.SupportedFeatures)
	}
	if !slices.Equal(opts.ConformanceProfiles, []suite.ConformanceProfileName{"GATEWAY-HTTP"}) {
		t.Errorf("profiles from the options file were replaced by %v", opts.ConformanceProfiles)
	}
	if opts.Implementation.Version != "v9" {
		t.Errorf("an explicit -version was replaced by %q", opts.Implementation.Version)
	}
}

func TestAllFeaturesKeepsTheFeatureListEmpty(t *testing.T) {
	opts := upstreamDefaults()
	opts.EnableAllSupportedFeatures = true
	ApplyDefaults(&opts, map[string]bool{"all-features": true}, env(nil))
	if len(opts.SupportedFeatures) != 0 {
		t.Errorf("-all-features got a feature list %v", opts.SupportedFeatures)
	}
}

// The suite's base manifests run the upstream echo server; DUET_ECHO_IMAGE renames it and
// nothing else.
func TestEchoImageRenamesOnlyTheEchoServer(t *testing.T) {
	base, err := fs.ReadFile(&conformance.Manifests, "base/manifests.yaml")
	if err != nil {
		t.Fatal(err)
	}
	upstream := imageLines(string(base), "registry.k8s.io/gateway-api/echo-basic:")
	if upstream < 10 {
		t.Fatalf("the upstream base manifests name the echo image %d times", upstream)
	}
	rewritten, err := WithEchoImage(&conformance.Manifests, "duet.test/echo:local")
	if err != nil {
		t.Fatal(err)
	}
	got, err := fs.ReadFile(rewritten, "base/manifests.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if n := imageLines(string(got), "duet.test/echo:local"); n != upstream {
		t.Errorf("%d echo images renamed, want %d", n, upstream)
	}
	if strings.Contains(string(got), "echo-basic") {
		t.Error("an echo-basic image is left")
	}
	// coredns (the UDP profile's backend) keeps its image.
	if !strings.Contains(string(got), "image: registry.k8s.io/coredns/coredns:") {
		t.Error("the coredns image was renamed too")
	}
	if _, err := fs.ReadFile(rewritten, "tests/httproute-simple-same-namespace.yaml"); err != nil {
		t.Errorf("the test manifests are missing from the rewritten FS: %v", err)
	}
}

func TestNoEchoImageKeepsTheUpstreamManifests(t *testing.T) {
	got, err := WithEchoImage(&conformance.Manifests, "")
	if err != nil {
		t.Fatal(err)
	}
	if got != fs.FS(&conformance.Manifests) {
		t.Error("an empty DUET_ECHO_IMAGE must leave the upstream manifests as they are")
	}
}

// imageLines counts the lines that are exactly "image: <prefix>..." (the whole image name when
// prefix is one).
func imageLines(manifest, prefix string) int {
	n := 0
	for _, line := range strings.Split(manifest, "\n") {
		image, ok := strings.CutPrefix(strings.TrimSpace(line), "image: ")
		if ok && strings.HasPrefix(image, prefix) && (strings.HasSuffix(prefix, ":") || image == prefix) {
			n++
		}
	}
	return n
}
