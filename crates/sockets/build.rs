//! Links libsoftrdma_sockets.so with SONAME `libsoftrdma-sockets.so.1`,
//! the name it is installed and preloaded under.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libsoftrdma-sockets.so.1");
}
