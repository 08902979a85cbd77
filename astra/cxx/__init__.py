"""C++ source text read by hand, for every stage of Astra: `decls` cuts a file into its
namespace-scope declarations."""
