package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sort"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	typed "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset/typed/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/gateway-api/pkg/consts"
	"sigs.k8s.io/yaml"
)

const modulePath = "sigs.k8s.io/gateway-api"

// CRD is one CustomResourceDefinition with the YAML document it came from.
type CRD struct {
	Object apiextensionsv1.CustomResourceDefinition
	YAML   []byte
}

// pinnedVersion is the sigs.k8s.io/gateway-api version this binary was built against.
func pinnedVersion() (string, error) {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "", fmt.Errorf("no build information in this binary")
	}
	for _, dep := range info.Deps {
		if dep.Path == modulePath {
			return dep.Version, nil
		}
	}
	return "", fmt.Errorf("%s is not among this binary's dependencies", modulePath)
}

// moduleDir asks the go command for the module cache directory of modulePath@version.
func moduleDir(version string) (string, error) {
	out, err := exec.Command("go", "mod", "download", "-json", modulePath+"@"+version).Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s@%s: %w", modulePath, version, err)
	}
	var mod struct{ Dir string }
	if err := yaml.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		return "", fmt.Errorf("go mod download %s@%s gave no directory", modulePath, version)
	}
	return mod.Dir, nil
}

// Channels are the release channels of the Gateway API CRDs: standard, and experimental (the
// standard kinds with their experimental fields, and the experimental kinds).
var Channels = []string{"standard", "experimental"}

// loadPinned loads the CRDs of a channel from dir, or from the pinned module when dir is empty.
func loadPinned(dir, channel string) ([]CRD, error) {
	if dir == "" {
		version, err := pinnedVersion()
		if err != nil {
			return nil, err
		}
		if dir, err = moduleDir(version); err != nil {
			return nil, err
		}
	}
	return loadChannel(dir, channel, consts.BundleVersion)
}

// loadStandard is loadChannel of the standard channel.
func loadStandard(dir, bundleVersion string) ([]CRD, error) {
	return loadChannel(dir, "standard", bundleVersion)
}

// loadChannel reads every CustomResourceDefinition under dir/config/crd/CHANNEL, sorted by
// name, and checks each is of that channel and of bundleVersion.
func loadChannel(dir, channel, bundleVersion string) ([]CRD, error) {
	if !slices.Contains(Channels, channel) {
		return nil, fmt.Errorf("unknown channel %q (want standard or experimental)", channel)
	}
	files, err := filepath.Glob(filepath.Join(dir, "config", "crd", channel, "*.yaml"))
	if err != nil {
		return nil, err
	}
	var crds []CRD
	for _, file := range files {
		found, err := readCRDs(file)
		if err != nil {
			return nil, err
		}
		crds = append(crds, found...)
	}
	if len(crds) == 0 {
		return nil, fmt.Errorf("no CustomResourceDefinition under %s/config/crd/%s", dir, channel)
	}
	for _, crd := range crds {
		if err := checkBundle(crd.Object, channel, bundleVersion); err != nil {
			return nil, err
		}
	}
	sort.Slice(crds, func(i, j int) bool { return crds[i].Object.Name < crds[j].Object.Name })
	return crds, nil
}

// readCRDs returns the CustomResourceDefinition documents of one YAML file (the directory also
// holds a ValidatingAdmissionPolicy, which is left out).
func readCRDs(file string) ([]CRD, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var crds []CRD
	for {
		doc, err := reader.Read()
		if err == io.EOF {
			return crds, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if meta.Kind != "CustomResourceDefinition" {
			continue
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(doc, &crd); err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		crds = append(crds, CRD{Object: crd, YAML: bytes.TrimSpace(doc)})
	}
}

func checkBundle(crd apiextensionsv1.CustomResourceDefinition, channel, bundleVersion string) error {
	if got := crd.Annotations[consts.BundleVersionAnnotation]; got != bundleVersion {
		return fmt.Errorf("%s has bundle version %q, want %q", crd.Name, got, bundleVersion)
	}
	if got := crd.Annotations[consts.ChannelAnnotation]; got != channel {
		return fmt.Errorf("%s is of channel %q, want %s", crd.Name, got, channel)
	}
	return nil
}

// printCRDs writes the CRDs as one multi-document YAML stream.
func printCRDs(w io.Writer, crds []CRD) error {
	for _, crd := range crds {
		if _, err := fmt.Fprintf(w, "---\n%s\n", crd.YAML); err != nil {
			return err
		}
	}
	return nil
}

// apply creates each CRD, or updates it in place when it exists.
func apply(ctx context.Context, api typed.CustomResourceDefinitionInterface, crds []CRD) error {
	for _, crd := range crds {
		want := crd.Object.DeepCopy()
		have, err := api.Get(ctx, want.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = api.Create(ctx, want, metav1.CreateOptions{})
		case err == nil:
			want.ResourceVersion = have.ResourceVersion
			_, err = api.Update(ctx, want, metav1.UpdateOptions{})
		}
		if err != nil {
			return fmt.Errorf("applying %s: %w", want.Name, err)
		}
	}
	return nil
}

// waitEstablished polls until every CRD has Established=True, or ctx ends.
func waitEstablished(ctx context.Context, api typed.CustomResourceDefinitionInterface, crds []CRD, every time.Duration) error {
	for _, crd := range crds {
		for {
			have, err := api.Get(ctx, crd.Object.Name, metav1.GetOptions{})
			if err == nil && established(have) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s is not Established: %w", crd.Object.Name, ctx.Err())
			case <-time.After(every):
			}
		}
	}
	return nil
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, cond := range crd.Status.Conditions {
		if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}
