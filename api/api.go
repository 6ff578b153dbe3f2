// Package api holds the OpenAPI description of sluice's HTTP API
// (openapi.yaml), embedded so that sluice serve can serve it at
// /openapi.yaml.
package api

import _ "embed"

// OpenAPI is openapi.yaml: the decision API, forward auth, reset,
// health and metrics endpoints, their bodies and their errors.
//
//go:embed openapi.yaml
var OpenAPI string
