//! Link flags of libchidori.so.

fn main() {
    // Every symbol the core references must be defined: a generated export that names a
    // hand-written function nobody wrote fails here instead of at the user's `import torch`.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,defs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libchidori.so");
    println!("cargo:rerun-if-changed=build.rs");
}
