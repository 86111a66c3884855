//go:build tools

// Package tools pins h2spec (the HTTP/2 conformance tester) for duet's e2e_h2spec test.
package tools

import _ "github.com/summerwind/h2spec/cmd/h2spec"
