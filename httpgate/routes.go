package httpgate

import (
	"cmp"
	"encoding/json"
	"io"
	"net/http"
	"strings"

	"github.com/sluicehq/sluice/api"
)

// route is one endpoint of a listener: how the mux finds it and the line
// the index at / gives it.
type route struct {
	method string // "" = any method
	path   string
	about  string
	h      http.Handler
}

// Index is the answer of GET /: the endpoints this listener serves and
// where their description is.
type Index struct {
	Service   string     `json:"service"`
	Endpoints []Endpoint `json:"endpoints"`
	// OpenAPI is the path of the OpenAPI description (api/openapi.yaml).
	OpenAPI string `json:"openapi"`
}

// Endpoint is one line of the Index.
type Endpoint struct {
	// Method is an HTTP method, or "ANY".
	Method string `json:"method"`
	Path   string `json:"path"`
	About  string `json:"about"`
}

const openAPIPath = "/openapi.yaml"

// serveRoutes builds a listener's mux from its routes, adding the index
// at /, the OpenAPI description, and problem+json answers for every path
// and method it does not serve: a 405 with Allow, or a 404 that points at
// the index.
func serveRoutes(routes []route) http.Handler {
	idx := Index{Service: "sluice", OpenAPI: openAPIPath}
	routes = append(routes,
		route{"GET", openAPIPath, "this API's OpenAPI 3 description", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/yaml")
			io.WriteString(w, api.OpenAPI)
		})},
		route{"GET", "/", "this list", nil},
	)
	for _, rt := range routes {
		m := cmp.Or(rt.method, "ANY")
		idx.Endpoints = append(idx.Endpoints, Endpoint{Method: m, Path: rt.path, About: rt.about})
	}
	// Indented: it is read by people, with curl. (Strings only: it
	// always marshals.)
	index, _ := json.MarshalIndent(idx, "", "  ")
	index = append(index, '\n')
	mux := http.NewServeMux()
	for _, rt := range routes {
		h, pattern := rt.h, rt.path
		if pattern == "/" {
			pattern = "/{$}"
			h = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.Write(index)
			})
		}
		if rt.method != "" {
			pattern = rt.method + " " + pattern
		}
		mux.Handle(pattern, h)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		var allow []string
		for _, rt := range routes {
			if rt.path == r.URL.Path {
				allow = append(allow, rt.method)
				if rt.method == "GET" {
					allow = append(allow, "HEAD")
				}
			}
		}
		if len(allow) == 0 {
			badRequest(w, http.StatusNotFound, "no endpoint at this path; GET / lists the endpoints")
			return
		}
		w.Header().Set("Allow", strings.Join(allow, ", "))
		badRequest(w, http.StatusMethodNotAllowed, r.URL.Path+" takes "+strings.Join(allow, " or ")+"; GET / lists the endpoints")
	})
	return mux
}
