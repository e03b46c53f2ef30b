//! Links libexs.so with SONAME `libexs.so.1`, the name it is installed
//! under (`-lexs` finds it through the `libexs.so` link).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libexs.so.1");
}
