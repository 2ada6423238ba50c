"""Admin pages for records of what happened: nobody adds or edits them there."""

from django.contrib import admin


class ReadOnlyAdmin(admin.ModelAdmin):
    """Records of what happened: viewable (and deletable, unless a subclass says no),
    never added or edited by hand."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


class EvidenceAdmin(ReadOnlyAdmin):
    """Records that are evidence (the audit trail, replay jobs): not deletable either."""

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
