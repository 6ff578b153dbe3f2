// Package serverconf holds the settings of sluice serve's listeners and
// its store: the addresses it listens on (listen, grpc_listen, api_listen,
// proxy), where bucket state lives (store), and the bounds of its HTTP
// and gRPC listeners (the server, grpc and grpc_tls sections). They live
// in the same configuration file as the rules, and policy.ParseConfig
// reads them from it; they are apart from package policy's Policy because
// they say how the server runs, not what a request is allowed, and only
// the server needs them.
package serverconf
