"""A serializer that refuses fields it does not know: a typo ("wieght") is a 422 naming
it, not a request that silently changes nothing."""

from rest_framework import serializers


class StrictSerializer(serializers.Serializer):
    def to_internal_value(self, data: object) -> dict:
        if isinstance(data, dict):
            writable = {name for name, field in self.fields.items() if not field.read_only}
            unknown = sorted(str(name) for name in data if name not in writable)
            if unknown:
                raise serializers.ValidationError(
                    {name: ["Not a field this operation takes."] for name in unknown}
                )
        return super().to_internal_value(data)


class StrictModelSerializer(StrictSerializer, serializers.ModelSerializer):
    pass
