package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset/fake"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/gateway-api/pkg/consts"
	"sigs.k8s.io/yaml"
)

// The kinds duet serves and the version each is read at.
var duetKinds = map[string]string{
	"gatewayclasses.gateway.networking.k8s.io":     "v1",
	"gateways.gateway.networking.k8s.io":           "v1",
	"httproutes.gateway.networking.k8s.io":         "v1",
	"grpcroutes.gateway.networking.k8s.io":         "v1",
	"referencegrants.gateway.networking.k8s.io":    "v1",
	"tlsroutes.gateway.networking.k8s.io":          "v1",
	"backendtlspolicies.gateway.networking.k8s.io": "v1",
	"listenersets.gateway.networking.k8s.io":       "v1",
}

func pinned(t *testing.T) []CRD {
	t.Helper()
	crds, err := loadPinned("", "standard")
	if err != nil {
		t.Fatal(err)
	}
	return crds
}

func TestPinnedCRDsAreTheSuitesBundleServingDuetsKinds(t *testing.T) {
	if consts.BundleVersion != "v1.6.3" {
		t.Fatalf("go.mod pins bundle %s; update the README and controller/src/gateway with it", consts.BundleVersion)
	}
	byName := map[string]apiextensionsv1.CustomResourceDefinition{}
	for _, crd := range pinned(t) {
		byName[crd.Object.Name] = crd.Object
	}
	for name, version := range duetKinds {
		crd, ok := byName[name]
		if !ok {
			t.Errorf("%s is not among the standard CRDs", name)
			continue
		}
		if !served(crd, version) {
			t.Errorf("%s does not serve %s", name, version)
		}
	}
	if _, ok := byName["tcproutes.gateway.networking.k8s.io"]; !ok {
		t.Error("the other standard CRDs are missing: the suite expects the whole standard install")
	}
}

// The experimental channel carries the same kinds with their experimental fields (HTTPRoute's
// retry among them) and the experimental kinds; an unknown channel is refused.
func TestExperimentalChannelAddsTheExperimentalFields(t *testing.T) {
	crds, err := loadPinned("", "experimental")
	if err != nil {
		t.Fatal(err)
	}
	var httproute []byte
	names := map[string]bool{}
	for _, crd := range crds {
		names[crd.Object.Name] = true
		if crd.Object.Name == "httproutes.gateway.networking.k8s.io" {
			httproute = crd.YAML
		}
	}
	for name := range duetKinds {
		if !names[name] {
			t.Errorf("%s is not among the experimental CRDs", name)
		}
	}
	if !bytes.Contains(httproute, []byte("retry:")) {
		t.Error("the experimental HTTPRoute CRD has no retry field")
	}
	if bytes.Contains(pinnedYAML(t, "httproutes.gateway.networking.k8s.io"), []byte("retry:")) {
		t.Error("the standard HTTPRoute CRD has a retry field")
	}
	if _, err := loadPinned("", "beta"); err == nil {
		t.Error("an unknown channel is accepted")
	}
}

func pinnedYAML(t *testing.T, name string) []byte {
	for _, crd := range pinned(t) {
		if crd.Object.Name == name {
			return crd.YAML
		}
	}
	t.Fatalf("no standard CRD %s", name)
	return nil
}

func served(crd apiextensionsv1.CustomResourceDefinition, version string) bool {
	for _, v := range crd.Spec.Versions {
		if v.Name == version && v.Served {
			return true
		}
	}
	return false
}

func TestPrintWritesOneDocumentPerCRD(t *testing.T) {
	crds := pinned(t)
	var out bytes.Buffer
	if err := printCRDs(&out, crds); err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(out.String(), "---\n")[1:]
	if len(docs) != len(crds) {
		t.Fatalf("%d documents for %d CRDs", len(docs), len(crds))
	}
	for i, doc := range docs {
		var back apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict([]byte(doc), &back); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		if back.Name != crds[i].Object.Name || back.Kind != "CustomResourceDefinition" {
			t.Errorf("document %d is %s %s, want %s", i, back.Kind, back.Name, crds[i].Object.Name)
		}
	}
	if strings.Contains(out.String(), "ValidatingAdmissionPolicy") {
		t.Error("the safe-upgrades admission policy is not a CRD and is left out")
	}
}

// A CRD of another bundle (an older install left on the cluster's tooling path) is refused: the
// suite would refuse the run later and less clearly.
func TestAnotherBundleVersionIsRefused(t *testing.T) {
	dir := t.TempDir()
	std := filepath.Join(dir, "config", "crd", "standard")
	if err := os.MkdirAll(std, 0o755); err != nil {
		t.Fatal(err)
	}
	crd := `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gateways.gateway.networking.k8s.io
  annotations:
    gateway.networking.k8s.io/bundle-version: v1.5.1
    gateway.networking.k8s.io/channel: standard
`
	if err := os.WriteFile(filepath.Join(std, "gw.yaml"), []byte(crd), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := loadStandard(dir, "v1.6.3")
	if err == nil || !strings.Contains(err.Error(), `bundle version "v1.5.1"`) {
		t.Fatalf("err = %v, want a refusal naming v1.5.1", err)
	}
	if _, err := loadStandard(dir, "v1.5.1"); err != nil {
		t.Fatalf("the matching bundle is refused: %v", err)
	}
	if _, err := loadStandard(t.TempDir(), "v1.6.3"); err == nil {
		t.Fatal("a directory without CRDs is accepted")
	}
}

func TestApplyCreatesThenUpdatesInPlace(t *testing.T) {
	crds := pinned(t)
	client := fake.NewSimpleClientset()
	api := client.ApiextensionsV1().CustomResourceDefinitions()
	ctx := context.Background()
	if err := apply(ctx, api, crds); err != nil {
		t.Fatal(err)
	}
	list, err := api.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != len(crds) {
		t.Fatalf("%d CRDs on the cluster, want %d", len(list.Items), len(crds))
	}
	// An existing CRD with other contents (an older install) is replaced by the pinned one.
	old := list.Items[0].DeepCopy()
	old.Annotations[consts.BundleVersionAnnotation] = "v1.5.1"
	if _, err := api.Update(ctx, old, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := apply(ctx, api, crds); err != nil {
		t.Fatalf("second apply: %v", err)
	}
	now, err := api.Get(ctx, old.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := now.Annotations[consts.BundleVersionAnnotation]; got != consts.BundleVersion {
		t.Errorf("after apply %s has bundle %s, want %s", old.Name, got, consts.BundleVersion)
	}
}

func TestWaitEstablishedWaitsForTheCondition(t *testing.T) {
	crds := pinned(t)[:1]
	client := fake.NewSimpleClientset()
	api := client.ApiextensionsV1().CustomResourceDefinitions()
	if err := apply(context.Background(), api, crds); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := waitEstablished(short, api, crds, 10*time.Millisecond); err == nil {
		t.Fatal("a CRD without Established=True counted as established")
	}
	crd, err := api.Get(context.Background(), crds[0].Object.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	crd.Status.Conditions = []apiextensionsv1.CustomResourceDefinitionCondition{
		{Type: apiextensionsv1.Established, Status: apiextensionsv1.ConditionTrue},
	}
	if _, err := api.UpdateStatus(context.Background(), crd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := waitEstablished(context.Background(), api, crds, 10*time.Millisecond); err != nil {
		t.Fatalf("an Established CRD: %v", err)
	}
}
