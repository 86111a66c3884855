// Package gateway holds duet's settings for the upstream Gateway API conformance suite
// (sigs.k8s.io/gateway-api/conformance, pinned in go.mod). The suite itself runs unmodified from
// conformance_test.go; this file only chooses duet's defaults for the upstream options.
package gateway

import (
	"io/fs"
	"regexp"
	"testing/fstest"

	"sigs.k8s.io/gateway-api/conformance/utils/flags"
	"sigs.k8s.io/gateway-api/conformance/utils/suite"
	"sigs.k8s.io/gateway-api/pkg/features"
)

// duet's identity in the ConformanceReport, and the GatewayClass it runs against.
const (
	GatewayClassName = "duet"
	ControllerName   = "duet.dev/gateway-controller"
	Organization     = "duet-dev"
	Project          = "duet"
	URL              = "https://github.com/duet-dev/duet"
	Contact          = "https://github.com/duet-dev/duet/issues"
	// Mode is the report's mode: duet runs in a (test) cluster, not in a mode of its own.
	Mode = flags.DefaultMode
)

// Profiles are the conformance profiles duet claims: HTTP, gRPC and TLS on Gateways.
var Profiles = []suite.ConformanceProfileName{
	suite.GatewayHTTPConformanceProfileName,
	suite.GatewayGRPCConformanceProfileName,
	suite.GatewayTLSConformanceProfileName,
}

// SupportedFeatures are the features passed to the suite when no -supported-features flag is
// given: the Core features of Profiles and the Extended features duet passes on both family
// orders. duet's GatewayClass status.supportedFeatures (controller/src/gateway/class.rs) lists
// the same.
var SupportedFeatures = []features.FeatureName{
	features.SupportGateway,
	features.SupportReferenceGrant,
	features.SupportHTTPRoute,
	features.SupportGRPCRoute,
	features.SupportBackendTLSPolicy,
	features.SupportBackendTLSPolicySANValidation,
	features.SupportGatewayBackendClientCertificate,
	features.SupportGatewayFrontendClientCertificateValidation,
	features.SupportGatewayFrontendClientCertificateValidationInsecureFallback,
	features.SupportGatewayHTTPListenerIsolation,
	features.SupportGatewayHTTPSListenerDetectMisdirectedRequests,
	features.SupportGatewayPort8080,
	features.SupportGatewayAddressEmpty,
	features.SupportGatewayInfrastructure,
	features.SupportGatewayStaticAddresses,
	features.SupportHTTPRoute303RedirectStatusCode,
	features.SupportHTTPRoute307RedirectStatusCode,
	features.SupportHTTPRoute308RedirectStatusCode,
	features.SupportHTTPRouteBackendProtocolH2C,
	features.SupportHTTPRouteBackendProtocolWebSocket,
	features.SupportHTTPRouteBackendRequestHeaderModification,
	features.SupportHTTPRouteBackendTimeout,
	features.SupportHTTPRouteCORS,
	features.SupportHTTPRouteDestinationPortMatching,
	features.SupportHTTPRouteHostRewrite,
	features.SupportHTTPRouteMethodMatching,
	features.SupportHTTPRouteNamedRouteRule,
	features.SupportHTTPRouteParentRefPort,
	features.SupportHTTPRoutePathRedirect,
	features.SupportHTTPRoutePathRewrite,
	features.SupportHTTPRoutePortRedirect,
	features.SupportHTTPRouteQueryParamMatching,
	features.SupportHTTPRouteRequestMirror,
	features.SupportHTTPRouteRequestMultipleMirrors,
	features.SupportHTTPRouteRequestPercentageMirror,
	features.SupportHTTPRouteRequestTimeout,
	features.SupportHTTPRouteResponseHeaderModification,
	features.SupportHTTPRouteRetry,
	features.SupportHTTPRouteSchemeRedirect,
	features.SupportListenerSet,
	features.SupportTLSRoute,
	features.SupportTLSRouteModeMixed,
	features.SupportTLSRouteModeTerminate,
}

// onStandardCRDs are experimental-channel features whose tests use only fields the standard
// channel's CRDs have (TLS listeners of both modes on one port): duet serves them whatever the
// channel, so they are claimed on both. Left out on the standard channel, the suite would run
// their "not supported" tests there instead, which expect duet to refuse what it serves.
var onStandardCRDs = map[features.FeatureName]bool{
	features.SupportTLSRouteModeMixed: true,
}

// ForChannel returns the features usable on CRDs of a channel: on the standard channel (any
// channel but "experimental") the experimental-channel features are left out, since their
// fields are missing from the standard CRDs (HTTPRoute's retry, for one), but for those of
// onStandardCRDs.
func ForChannel(all []features.FeatureName, channel string) []features.FeatureName {
	var out []features.FeatureName
	for _, name := range all {
		if channel != "experimental" && features.GetFeature(name).Channel == features.FeatureChannelExperimental && !onStandardCRDs[name] {
			continue
		}
		out = append(out, name)
	}
	return out
}

// Env is how options read the environment (os.Getenv in the test, a map in unit tests).
type Env func(string) string

// ApplyDefaults fills the options that neither an upstream flag (named in explicit) nor the
// options file set with duet's values.
func ApplyDefaults(opts *suite.ConformanceOptions, explicit map[string]bool, env Env) {
	if !explicit["gateway-class"] && opts.GatewayClassName == flags.DefaultGatewayClassName {
		opts.GatewayClassName = GatewayClassName
	}
	if !explicit["conformance-profiles"] && len(opts.ConformanceProfiles) == 0 {
		opts.ConformanceProfiles = append([]suite.ConformanceProfileName(nil), Profiles...)
	}
	if !explicit["supported-features"] && !explicit["all-features"] && len(opts.SupportedFeatures) == 0 &&
		!opts.EnableAllSupportedFeatures {
		opts.SupportedFeatures = ForChannel(SupportedFeatures, env("DUET_GATEWAY_CHANNEL"))
	}
	applyImplementation(opts, explicit, env)
}

// applyImplementation fills the report's implementation metadata; the version comes from
// DUET_VERSION (run.sh passes the workspace version) unless -version is given.
func applyImplementation(opts *suite.ConformanceOptions, explicit map[string]bool, env Env) {
	impl := &opts.Implementation
	if !explicit["organization"] && impl.Organization == "" {
		impl.Organization = Organization
	}
	if !explicit["project"] && impl.Project == "" {
		impl.Project = Project
	}
	if !explicit["url"] && impl.URL == "" {
		impl.URL = URL
	}
	if !explicit["contact"] && len(impl.Contact) == 0 {
		impl.Contact = []string{Contact}
	}
	if !explicit["version"] && impl.Version == "" {
		impl.Version = env("DUET_VERSION")
	}
}

// echoBasicImage matches the upstream echo server image in the suite's manifests, any tag.
var echoBasicImage = regexp.MustCompile(`registry\.k8s\.io/gateway-api/echo-basic:[A-Za-z0-9._-]+`)

// WithEchoImage returns a copy of manifests in which every echo-basic image reference names
// image instead (for a test cluster that runs its own build of the echo server under another
// name). The tests and every other byte of the manifests are unchanged. An empty image returns
// manifests itself.
func WithEchoImage(manifests fs.FS, image string) (fs.FS, error) {
	if image == "" {
		return manifests, nil
	}
	out := fstest.MapFS{}
	err := fs.WalkDir(manifests, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(manifests, path)
		if err != nil {
			return err
		}
		out[path] = &fstest.MapFile{Data: echoBasicImage.ReplaceAll(data, []byte(image)), Mode: 0o444}
		return nil
	})
	return out, err
}
