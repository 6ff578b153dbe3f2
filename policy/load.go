package policy

import (
	"errors"
	"os"
)

// Load reads and validates the configuration file at path.
func Load(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &Errors{List: []error{&Error{File: path, Msg: err.Error()}}}
	}
	return Parse(path, data)
}

// Parse validates a configuration given as bytes (YAML or JSON); name is
// used in error messages and to resolve relative paths (PEM and JWKS
// files) against its directory.
func Parse(name string, data []byte) (*Policy, error) {
	return nil, errors.New("policy: not implemented yet")
}

// DefaultYAML is the embedded policy sluice serve runs without a config:
// a per-IP token bucket of 10 rps, burst 20, on the memory store.
const DefaultYAML = `# sluice's embedded default policy
rules:
  - name: per-ip
    limit_keys: ["ip:address"]
    algorithm: token_bucket
    algorithm_config:
      rps: 10
      burst: 20
`

// Default returns the embedded default policy (DefaultYAML).
func Default() *Policy {
	p, err := Parse("<default>", []byte(DefaultYAML))
	if err != nil {
		panic("policy: the embedded default is invalid: " + err.Error())
	}
	return p
}
