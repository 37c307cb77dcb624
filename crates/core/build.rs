//! The messages in locales/*.yml are compiled in (rust-i18n's `i18n!`): build again when
//! they change.
fn main() {
    println!("cargo:rerun-if-changed=locales");
}
