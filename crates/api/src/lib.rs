//! Tidemark's resource types (`tidemark.io/v1alpha1`), shared by the command line and the
//! operator so the same YAML serves both. No I/O.

pub mod config;
pub mod crd;
pub(crate) mod cron;
pub mod fields;
pub mod interval;
pub mod lifecycle;
pub(crate) mod maplist;
pub mod names;
pub mod policy;
pub mod quantity;
pub mod restore;
pub mod schedule;
pub mod version;

pub use policy::{
    BackupPolicy, BackupPolicySpec, DeletionPolicy, ObjectStoreSpec, PodResources, Resources,
    RetentionSpec,
};
pub use schedule::{
    BackupDocument, BackupSpec, OwnerReferenceMode, ScheduledBackup, ScheduledBackupSpec,
};

/// API group and version of every Tidemark kind.
pub use version::API_VERSION;

/// The schema of an enum read leniently (its `Unknown` variant catches what a newer CRD
/// allows): a string of the known values, as the derived schema was, without `Unknown`.
#[macro_export]
#[doc(hidden)]
macro_rules! known_values_schema {
    ($ty:ident, [$($v:literal),+]) => {
        impl schemars::JsonSchema for $ty {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($ty).into()
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({ "type": "string", "enum": [$($v),+] })
            }
        }
    };
}

/// A spec enum read leniently: its known names map to their variants, any other string
/// to `Unknown(value)` — so that one object a newer CRD allows does not stop a watch of
/// every object — and `validate` refuses it, naming the value and the known ones. The
/// schema lists only the known names.
#[macro_export]
#[doc(hidden)]
macro_rules! lenient_enum {
    ($ty:ident { $($v:ident = $s:literal),+ $(,)? }) => {
        impl $ty {
            /// The accepted names.
            pub const KNOWN: &'static [&'static str] = &[$($s),+];

            /// Its name as written.
            pub fn as_str(&self) -> &str {
                match self {
                    $($ty::$v => $s,)+
                    $ty::Unknown(s) => s,
                }
            }

            /// Why an unknown value is refused: the value and the accepted names.
            pub fn unknown(&self) -> String {
                format!(
                    "{:?} is a value this version of Tidemark does not know (from a newer CRD?); expected {}",
                    self.as_str(),
                    Self::KNOWN.join(", ")
                )
            }
        }

        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Ok(match s.as_str() {
                    $($s => $ty::$v,)+
                    _ => $ty::Unknown(s),
                })
            }
        }

        $crate::known_values_schema!($ty, [$($s),+]);
    };
}
